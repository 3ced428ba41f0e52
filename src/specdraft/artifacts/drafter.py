"""Read a drafter back from disk: a specdraft drafter directory or an exported engine directory.

Used by ``export`` (the trained state), ``eval`` (``--drafter DIR``) and ``doctor``. Tensors are
returned under specdraft's checkpoint names (``midlayer.*``), whatever the format on disk.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from specdraft.core.errors import InputError, clip
from specdraft.core.jsonl import read_json
from specdraft.artifacts.formats import FORMAT_SPECS, detect_format, drafter_config_from_export, \
    inverse, rename
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel
from specdraft.artifacts.dflash_export import ARCH as DFLASH_ARCH, read_dflash
from specdraft.models.io import CONFIG_FILE, WEIGHTS_FILE, drafter_from_config, is_dflash

EXPORT_CONFIG = "config.json"
EXPORT_WEIGHTS = "model.safetensors"

_INT = (int,)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    **{k: _INT for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                         "intermediate_size", "max_position_embeddings", "vocab_size",
                         "draft_vocab_size", "target_hidden_size")},
    "rms_norm_eps": (float, int), "rope_theta": (float, int),
    "partial_rotary_factor": (float, int)}


@dataclass
class DrafterOnDisk:
    """A drafter read from ``path``: its :class:`Eagle3Config`, tensors under our names, the
    format (``"specdraft"`` or one of the export formats) and the raw ``config.json`` (exports)."""

    path: Path
    config: Eagle3Config
    state: dict[str, torch.Tensor]
    format: str
    raw_config: dict[str, Any] | None = None


def read_drafter(path: str | Path) -> DrafterOnDisk:
    """Read ``path`` (``drafter_config.json`` + ``drafter.safetensors``, or ``config.json`` +
    ``model.safetensors``). Raises :class:`InputError` naming the file and the missing or
    mistyped key, a config that is not JSON, or a weights file that is cut short or corrupt."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: drafter directory not found")
    if (path / CONFIG_FILE).exists():
        raw = _json_object(path / CONFIG_FILE)
        if is_dflash(raw):  # DFlashConfig.from_dict names every key it does not implement
            from specdraft.models.dflash import DFlashConfig

            cfg = _config(path / CONFIG_FILE, lambda: DFlashConfig.from_dict(raw), raw)
            return DrafterOnDisk(path, cfg, _load(path / WEIGHTS_FILE), "specdraft")
        _check_keys(path / CONFIG_FILE, raw)
        cfg = _config(path / CONFIG_FILE, lambda: _config_class(raw).from_dict(raw), raw)
        return DrafterOnDisk(path, cfg, _load(path / WEIGHTS_FILE), "specdraft")
    if (path / EXPORT_CONFIG).exists():
        raw = _json_object(path / EXPORT_CONFIG)
        if raw.get("architectures") == [DFLASH_ARCH]:  # vLLM's native DFlash format
            cfg, state = read_dflash(path)
            return DrafterOnDisk(path, cfg, state, "dflash", raw)
        fmt = detect_format(raw)
        cfg = _config(path / EXPORT_CONFIG, lambda: _export_config(raw, fmt), raw, fmt=fmt)
        state = _export_state(raw, _load(path / EXPORT_WEIGHTS), fmt)
        return DrafterOnDisk(path, cfg, state, fmt, raw)
    raise InputError(f"{path}: neither a specdraft drafter ({CONFIG_FILE}) nor an exported "
                     f"drafter ({EXPORT_CONFIG})")


def is_dflash_drafter(d: DrafterOnDisk) -> bool:
    """``d`` is a DFlash drafter (:mod:`specdraft.models.dflash`), in specdraft's or vLLM's
    format."""
    from specdraft.models.dflash import DFlashConfig

    return isinstance(d.config, DFlashConfig)


def _json_object(path: Path) -> dict[str, Any]:
    raw = read_json(path, what="drafter config")
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _is_mla(raw: dict[str, Any]) -> bool:
    """A drafter config of the MLA layer (:mod:`specdraft.models.eagle3_mla`): specdraft's own
    (``kv_lora_rank`` / ``draft_layer`` mla) or its vLLM export (``Eagle3DeepseekV2ForCausalLM``)."""
    return "kv_lora_rank" in raw or raw.get("draft_layer") == "mla"


def _config_class(raw: dict[str, Any]) -> type[Eagle3Config]:
    if _is_mla(raw):
        from specdraft.models.eagle3_mla import Eagle3MLAConfig

        return Eagle3MLAConfig
    return Eagle3Config


def _check_keys(path: Path, raw: dict[str, Any]) -> None:
    """Missing and unknown keys of a specdraft drafter config, named (a renamed key shows as
    both); the fields are the drafter kind's (:class:`Eagle3Config`, or the MLA config)."""
    cls = _config_class(raw)
    known = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls)
                if f.default is MISSING and f.default_factory is MISSING}
    missing, unknown = sorted(required - set(raw)), sorted(set(raw) - known)
    if missing or unknown:
        raise InputError(f"{path}: missing key(s) {missing}, unknown key(s) "
                         f"{clip(unknown, 300)} for a specdraft drafter config")


def _export_config(raw: dict[str, Any], fmt: str) -> Eagle3Config:
    if _is_mla(raw):
        from specdraft.models.eagle3_mla import config_from_vllm

        return config_from_vllm(raw)
    return drafter_config_from_export(raw, fmt)


def _export_state(raw: dict[str, Any], state: dict[str, torch.Tensor], fmt: str
                  ) -> dict[str, torch.Tensor]:
    """The exported tensors under our names; the MLA export's ``t2d`` (not written: the image of
    ``d2t``) is rebuilt from ``d2t``."""
    state = rename(state, inverse(FORMAT_SPECS[fmt].rename))
    if _is_mla(raw) and "t2d" not in state and "d2t" in state:
        d2t = state["d2t"].long()
        t2d = torch.zeros(int(raw["vocab_size"]), dtype=torch.bool)
        t2d[torch.arange(d2t.numel()) + d2t] = True
        state["t2d"] = t2d
    return state


def _config(path: Path, build: Callable[[], Eagle3Config], raw: dict[str, Any], *,
            fmt: str = "specdraft") -> Eagle3Config:
    """``build()``, with its KeyError / TypeError / ValueError turned into an
    :class:`InputError` naming ``path`` and the key; field types are checked afterwards."""
    try:
        cfg = build()
    except KeyError as err:
        raise InputError(f"{path}: missing key {err} for the {fmt} format") from None
    except (TypeError, ValueError, AttributeError) as err:
        raise InputError(f"{path}: not a valid {fmt} drafter config ({clip(str(err), 200)})"
                         ) from None
    for f in fields(cfg):
        value, want = getattr(cfg, f.name), _FIELD_TYPES.get(f.name)
        if want is not None and (isinstance(value, bool) or not isinstance(value, want)):
            raise InputError(f"{path}: key {f.name!r} must be {want[0].__name__}, got "
                             f"{type(value).__name__} {value!r}")
    return cfg


def _load(path: Path) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise InputError(f"{path} not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise InputError(f"{path}: not a readable safetensors file (cut short or corrupt: "
                         f"{err})") from None


def build_model(d: DrafterOnDisk, *, verifier_embed: torch.Tensor | None = None,
                verifier_head: torch.Tensor | None = None, device: str = "cpu",
                dtype: torch.dtype = torch.float32) -> Eagle3DraftModel:
    """The drafter of ``d``'s kind (:func:`specdraft.models.io.drafter_from_config`) with
    ``d``'s weights. A missing ``embed_tokens.weight`` is taken from ``verifier_embed`` [V, H]
    and, for a DFlash drafter (whose export holds neither table), a missing ``lm_head.weight``
    from ``verifier_head`` [V, H] (what the engines do); missing ``d2t``/``t2d`` are refused.

    Raises :class:`InputError` for any other missing or unexpected tensor.
    """
    state = dict(d.state)
    shared = {"embed_tokens.weight": verifier_embed}
    if is_dflash_drafter(d):
        shared["lm_head.weight"] = verifier_head
    for name, table in shared.items():
        if name in state:
            continue
        if table is None:
            raise InputError(f"{d.path}: no {name}; pass the verifier to share its table")
        state[name] = table
    model = drafter_from_config(d.config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("rotary.")]
    if missing or unexpected:
        raise InputError(f"{d.path}: missing tensors {missing}, unexpected {unexpected}")
    return model.to(device=device, dtype=dtype).eval()
