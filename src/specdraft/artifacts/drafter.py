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

from specdraft import kinds
from specdraft.core.errors import InputError, clip
from specdraft.core.jsonl import read_json
from specdraft.artifacts.formats import FORMAT_SPECS, detect_format, inverse, rename
from specdraft.models.io import CONFIG_FILE, WEIGHTS_FILE, Drafter

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
    """A drafter read from ``path``: its config (its kind's class, which declares the kind),
    tensors under our names, the format (``"specdraft"`` or one of the kind's export formats)
    and the raw ``config.json`` (exports)."""

    path: Path
    config: Any
    state: dict[str, torch.Tensor]
    format: str
    raw_config: dict[str, Any] | None = None


def read_drafter(path: str | Path) -> DrafterOnDisk:
    """Read ``path`` (``drafter_config.json`` + ``drafter.safetensors``, or ``config.json`` +
    ``model.safetensors``), through its kind's home (:func:`specdraft.kinds.detect_kind`).
    Raises :class:`InputError` naming the file and the missing or mistyped key, a config that
    is not JSON, or a weights file that is cut short or corrupt."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: drafter directory not found")
    if (path / CONFIG_FILE).exists():
        raw = _json_object(path / CONFIG_FILE)
        home = kinds.get(kinds.detect_kind(raw, where=path / CONFIG_FILE)).hooks()
        home.check_keys(path / CONFIG_FILE, raw)
        cfg = parse_config(path / CONFIG_FILE, lambda: home.config_from_dict(raw))
        return DrafterOnDisk(path, cfg, load_tensors(path / WEIGHTS_FILE), "specdraft")
    if (path / EXPORT_CONFIG).exists():
        raw = _json_object(path / EXPORT_CONFIG)
        home = kinds.get(kinds.detect_kind(raw, where=path / EXPORT_CONFIG)).hooks()
        cfg, state, fmt = home.read_export(path, raw)
        return DrafterOnDisk(path, cfg, state, fmt, raw)
    raise InputError(f"{path}: neither a specdraft drafter ({CONFIG_FILE}) nor an exported "
                     f"drafter ({EXPORT_CONFIG})")


def _json_object(path: Path) -> dict[str, Any]:
    raw = read_json(path, what="drafter config")
    if not isinstance(raw, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    return raw


def check_keys(path: Path, raw: dict[str, Any], cls: type) -> None:
    """Missing and unknown keys of a specdraft drafter config of dataclass ``cls``, named (a
    renamed key shows as both); ``kind`` is the declared kind, not a field."""
    known = {f.name for f in fields(cls)} | {"kind"}
    required = {f.name for f in fields(cls)
                if f.default is MISSING and f.default_factory is MISSING}
    missing, unknown = sorted(required - set(raw)), sorted(set(raw) - known)
    if missing or unknown:
        raise InputError(f"{path}: missing key(s) {missing}, unknown key(s) "
                         f"{clip(unknown, 300)} for a specdraft drafter config")


def export_state(raw: dict[str, Any], state: dict[str, torch.Tensor], fmt: str
                 ) -> dict[str, torch.Tensor]:
    """The tensors of an EAGLE-3 format export (:data:`FORMAT_SPECS`) under our names."""
    return rename(state, inverse(FORMAT_SPECS[fmt].rename))


def read_export_format(path: Path, raw: dict[str, Any], build: Callable[[str], Any]
                       ) -> tuple[Any, dict[str, torch.Tensor], str]:
    """``(config, tensors, format)`` of an export in one of the :data:`FORMAT_SPECS` formats:
    the format detected from ``raw``, ``build(format)`` the config (errors named by
    :func:`parse_config`), the tensors renamed to ours."""
    fmt = detect_format(raw)
    cfg = parse_config(path / EXPORT_CONFIG, lambda: build(fmt), fmt=fmt)
    return cfg, export_state(raw, load_tensors(path / EXPORT_WEIGHTS), fmt), fmt


def parse_config(path: Path, build: Callable[[], Any], *, fmt: str = "specdraft") -> Any:
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


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.exists():
        raise InputError(f"{path} not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise InputError(f"{path}: not a readable safetensors file (cut short or corrupt: "
                         f"{err})") from None


def build_model(d: DrafterOnDisk, *, verifier_embed: torch.Tensor | None = None,
                verifier_head: torch.Tensor | None = None, device: str = "cpu",
                dtype: torch.dtype = torch.float32) -> Drafter:
    """The drafter of ``d``'s kind (its home's ``model``) with ``d``'s weights. A missing
    verifier table its kind shares (``shared_tables``: ``embed_tokens.weight`` [V, H] for every
    built-in kind; also ``lm_head.weight`` [V, H] for DFlash, whose export holds neither) is taken
    from ``verifier_embed`` / ``verifier_head`` (what the engines do); missing ``d2t``/``t2d``
    are refused.

    Raises :class:`InputError` for any other missing or unexpected tensor.
    """
    home = kinds.of(d).hooks()
    state = dict(d.state)
    given = {"embed_tokens.weight": verifier_embed, "lm_head.weight": verifier_head}
    for name in home.shared_tables():
        if name in state:
            continue
        if given[name] is None:
            raise InputError(f"{d.path}: no {name}; pass the verifier to share its table")
        state[name] = given[name]
    from specdraft.artifacts.rules import tensor_problems

    problems = tensor_problems(d.config, state)  # the rule export and doctor apply
    if problems:
        raise InputError(f"{d.path}: " + "; ".join(problems))
    model = home.model(d.config)
    model.load_state_dict(state, strict=False)  # every name and shape checked above
    return model.to(device=device, dtype=dtype).eval()


def drafter_from_dict(d: dict[str, Any]) -> Drafter:
    """A fresh drafter of the kind ``d`` declares (:func:`specdraft.kinds.detect_kind` for a
    config without ``kind``). Raises TypeError/ValueError on an invalid config."""
    home = kinds.get(kinds.detect_kind(d)).hooks()
    return home.model(home.config_from_dict(d))


def load_drafter(path: str | Path, *, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> Drafter:
    """Load a drafter directory written by :func:`specdraft.models.io.save_drafter` (strict:
    no missing or extra key).

    Raises FileNotFoundError naming the missing file, :class:`InputError` naming the file when
    the config is not a JSON drafter config, the weights are not safetensors (nothing is ever
    unpickled) or their names and shapes are not the config's (checked on the ``meta`` device
    before any allocation: a corrupt config never allocates its sizes).
    """
    path = Path(path)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).exists():
            raise FileNotFoundError(f"{path / name} not found: not a specdraft drafter directory")
    raw = read_json(path / CONFIG_FILE, what="drafter config")
    try:  # the config first, then its shapes on the meta device: absurd sizes allocate nothing
        if not isinstance(raw, dict):
            raise TypeError(f"expected a JSON object, got {type(raw).__name__}")
        with torch.device("meta"):
            shapes = {k: tuple(v.shape) for k, v in drafter_from_dict(raw).state_dict().items()}
    except (TypeError, ValueError, AttributeError, InputError, RuntimeError) as err:
        raise InputError(f"{path / CONFIG_FILE}: not a valid drafter config "
                         f"({clip(str(err), 200)})") from None
    state = load_tensors(path / WEIGHTS_FILE)
    stored = {k: tuple(v.shape) for k, v in state.items()}
    if shapes != stored:
        wrong = sorted(k for k in set(shapes) | set(stored) if shapes.get(k) != stored.get(k))
        raise InputError(f"{path}: {CONFIG_FILE} and {WEIGHTS_FILE} disagree on "
                         f"{clip(wrong, 200)} (config {clip([shapes.get(k) for k in wrong], 100)}"
                         f", weights {clip([stored.get(k) for k in wrong], 100)})")
    model = drafter_from_dict(raw)
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype).eval()
