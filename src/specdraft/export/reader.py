"""Read a drafter back from disk: a specdraft drafter directory or an exported engine directory.

Used by ``export`` (the trained state), ``eval`` (``--drafter DIR``) and ``doctor``. Tensors are
returned under specdraft's checkpoint names (``midlayer.*``), whatever the format on disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from specdraft.core.errors import InputError
from specdraft.export.formats import FORMAT_SPECS, detect_format, drafter_config_from_export, \
    inverse, rename
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel
from specdraft.models.io import CONFIG_FILE, WEIGHTS_FILE

EXPORT_CONFIG = "config.json"
EXPORT_WEIGHTS = "model.safetensors"


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
    ``model.safetensors``). Raises :class:`InputError` naming the missing file or key."""
    path = Path(path)
    if (path / CONFIG_FILE).exists():
        cfg = Eagle3Config.from_dict(json.loads((path / CONFIG_FILE).read_text()))
        return DrafterOnDisk(path, cfg, _load(path / WEIGHTS_FILE), "specdraft")
    if (path / EXPORT_CONFIG).exists():
        raw = json.loads((path / EXPORT_CONFIG).read_text())
        fmt = detect_format(raw)
        try:
            cfg = drafter_config_from_export(raw, fmt)
        except KeyError as err:
            raise InputError(f"{path / EXPORT_CONFIG}: missing key {err} for the {fmt} "
                             f"format") from None
        state = rename(_load(path / EXPORT_WEIGHTS), inverse(FORMAT_SPECS[fmt].rename))
        return DrafterOnDisk(path, cfg, state, fmt, raw)
    raise InputError(f"{path}: neither a specdraft drafter ({CONFIG_FILE}) nor an exported "
                     f"drafter ({EXPORT_CONFIG})")


def _load(path: Path) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise InputError(f"{path} not found")
    return load_file(str(path))


def build_model(d: DrafterOnDisk, *, verifier_embed: torch.Tensor | None = None,
                device: str = "cpu", dtype: torch.dtype = torch.float32) -> Eagle3DraftModel:
    """An :class:`Eagle3DraftModel` with ``d``'s weights. A missing ``embed_tokens.weight`` is
    taken from ``verifier_embed`` (what the engines do); missing ``d2t``/``t2d`` are refused.

    Raises :class:`InputError` for any other missing or unexpected tensor.
    """
    state = dict(d.state)
    if "embed_tokens.weight" not in state:
        if verifier_embed is None:
            raise InputError(f"{d.path}: no embed_tokens.weight; pass the verifier to share its "
                             f"embedding")
        state["embed_tokens.weight"] = verifier_embed
    model = Eagle3DraftModel(d.config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("rotary.")]
    if missing or unexpected:
        raise InputError(f"{d.path}: missing tensors {missing}, unexpected {unexpected}")
    return model.to(device=device, dtype=dtype).eval()
