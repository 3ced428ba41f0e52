"""Save and load a trained drafter as a directory: ``drafter_config.json`` + ``drafter.safetensors``.

This is specdraft's own format (``RUN/train/best/``, ``RUN/train/checkpoints/step-N/``); engine
formats are written by :mod:`specdraft.export`. The safetensors file holds
:meth:`Eagle3DraftModel.checkpoint_state` with ``embed_tokens.weight`` (the frozen copy of the
verifier's embedding), so a drafter directory is self-contained.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from specdraft.core.atomic import atomic_dir
from specdraft.core.errors import InputError, clip
from specdraft.core.jsonl import read_json
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel

CONFIG_FILE = "drafter_config.json"
WEIGHTS_FILE = "drafter.safetensors"


def save_drafter(model: Eagle3DraftModel, out_dir: str | Path) -> Path:
    """Write ``out_dir`` atomically (temp dir + rename); tensors saved contiguous, on CPU."""
    state = {k: v.detach().cpu().contiguous() for k, v in
             model.checkpoint_state(include_embed=True).items()}
    with atomic_dir(out_dir) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
        save_file(state, str(tmp / WEIGHTS_FILE))
    return Path(out_dir)


def is_dflash(d: dict) -> bool:
    """A DFlash drafter config (:class:`specdraft.models.dflash.DFlashConfig`: it alone has
    ``mask_token_id`` and ``target_layer_ids``)."""
    return "mask_token_id" in d and "target_layer_ids" in d


def drafter_from_dict(d: dict) -> Eagle3DraftModel:
    """A fresh drafter of the kind its config dict describes: the DFlash drafter
    (:mod:`specdraft.models.dflash`, :func:`is_dflash`), the MLA drafter
    (:mod:`specdraft.models.eagle3_mla`) when it holds ``kv_lora_rank`` or ``draft_layer``
    ``mla``, else the Llama/Qwen3 layer. Raises TypeError/ValueError on an invalid config."""
    if is_dflash(d):
        from specdraft.models.dflash import DFlashConfig, DFlashDraftModel

        return DFlashDraftModel(DFlashConfig.from_dict(d))
    if "kv_lora_rank" in d or d.get("draft_layer") == "mla":
        from specdraft.models.eagle3_mla import Eagle3MLAConfig

        return drafter_from_config(Eagle3MLAConfig.from_dict(d))
    return Eagle3DraftModel(Eagle3Config.from_dict(d))


def drafter_from_config(config: Eagle3Config) -> Eagle3DraftModel:
    """A fresh drafter of ``config``'s kind: :class:`Eagle3MLADraftModel` for an MLA config,
    :class:`~specdraft.models.dflash.DFlashDraftModel` for a DFlash one, else
    :class:`Eagle3DraftModel`."""
    from specdraft.models.dflash import DFlashConfig, DFlashDraftModel
    from specdraft.models.eagle3_mla import Eagle3MLAConfig, Eagle3MLADraftModel

    if isinstance(config, DFlashConfig):
        return DFlashDraftModel(config)
    if isinstance(config, Eagle3MLAConfig):
        return Eagle3MLADraftModel(config)
    return Eagle3DraftModel(config)


def load_drafter(path: str | Path, *, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> Eagle3DraftModel:
    """Load a drafter directory written by :func:`save_drafter` (strict: no missing or extra key).

    Raises FileNotFoundError naming the missing file, :class:`InputError` naming the file when
    the config is not a JSON drafter config or the weights are not safetensors (nothing is
    ever unpickled), RuntimeError on key mismatch.
    """
    path = Path(path)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).exists():
            raise FileNotFoundError(f"{path / name} not found: not a specdraft drafter directory")
    raw = read_json(path / CONFIG_FILE, what="drafter config")
    try:
        model = drafter_from_dict(raw)
    except (TypeError, ValueError, AttributeError) as err:
        raise InputError(f"{path / CONFIG_FILE}: not a valid drafter config "
                         f"({clip(str(err), 200)})") from None
    try:
        state = load_file(str(path / WEIGHTS_FILE))
    except (SafetensorError, OSError, ValueError) as err:
        raise InputError(f"{path / WEIGHTS_FILE}: not a readable safetensors file (cut short or "
                         f"corrupt: {err})") from None
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype).eval()
