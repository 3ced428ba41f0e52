"""The DFlash drafter in vLLM's native DFlash format: ``config.json`` + ``model.safetensors``,
validated before a byte is written, and read back the way vLLM reads it.

DFlash has one engine format (vLLM 0.32 native, ``architectures: ["DFlashDraftModel"]``,
registry -> ``model_executor/models/qwen3_dflash.py``), so it lives in this file rather than in
the EAGLE-3 format table of :mod:`specdraft.artifacts.formats`. What vLLM reads from the config
(facts from ``qwen3_dflash.py``, ``config/speculative.py``, ``v1/spec_decode/llm_base_proposer.py``
``_init_parallel_drafting_params``, ``v1/worker/gpu/spec_decode/eagle/eagle3_utils.py``):

- the Qwen3 layer keys (``model_type: qwen3``): hidden size, heads, kv heads, ``head_dim``,
  ``intermediate_size``, ``hidden_act``, ``rms_norm_eps``, ``rope_parameters``,
  ``max_position_embeddings``, ``vocab_size``, ``num_hidden_layers`` (the drafter's layers);
- ``dflash_config.target_layer_ids``: layer-output ids, captured at ``id + 1``; BUT a top-level
  ``eagle_aux_hidden_state_layer_ids`` takes precedence and is used without the +1, so it is
  refused here; ``fc`` is built ``len(ids) * (target_hidden_size or hidden_size)`` wide;
- ``dflash_config.mask_token_id``: the id of every mask slot (embedded by the verifier's table);
- causality per layer (``_dflash_layer_causal``): a top-level ``is_causal``, else
  ``dflash_config.causal``, else sliding ``layer_types`` entries; written explicitly as
  ``dflash_config.causal`` with full-attention ``layer_types``;
- ``dflash_config.sample_from_anchor`` (``v1/worker/gpu/spec_decode/dflash/speculator.py``,
  default false, true refused by vLLM): written false explicitly, refused on read when true;
- not read: ``block_size`` (``num_speculative_tokens`` = block size - 1 must be passed); written
  explicitly, and a config without it is refused on read (never defaulted: it decides
  specdraft's offline decode and the ``num_speculative_tokens`` the serve line passes).
- weights without ``embed_tokens`` / ``lm_head``: vLLM then shares the verifier's.

Keys that change the computation and that specdraft does not implement (sliding window, sink
bias, value scale, interleaved rope, a reduced draft vocab, a head of its own, ...) are refused
on read, by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from specdraft import kinds
from specdraft.core.atomic import atomic_dir, atomic_save_safetensors, atomic_write_json
from specdraft.core.errors import InputError
from specdraft.models.dflash import DFlashConfig, DFlashDraftModel, config_problems

ARCH = "DFlashDraftModel"
CONFIG, WEIGHTS = "config.json", "model.safetensors"

#: Keys whose value is metadata or what specdraft computes anyway: accepted when equal to it.
_FIXED = {"attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
          "use_sliding_window": False, "logit_scale": 1.0, "is_neox_style": True,
          "use_aux_hidden_state": True}
_METADATA = {"architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
             "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "block_size",
             "specdraft", "layer_types", "rope_theta", "sliding_window", "max_window_layers",
             "attention_dropout", "use_cache", "target_hidden_size", "draft_vocab_size"}
_LAYER = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
          "intermediate_size", "num_hidden_layers", "rms_norm_eps", "max_position_embeddings",
          "vocab_size", "hidden_act")
_DFLASH_KEYS = {"mask_token_id", "target_layer_ids", "causal", "use_aux_hidden_state",
                "sample_from_anchor"}
#: ``dflash_config`` keys specdraft implements at one value only (vLLM's DFlash refuses the other)
_DFLASH_FIXED = {"use_aux_hidden_state": True, "sample_from_anchor": False}


def speculative_method(export_dir: str | Path) -> str:
    """vLLM's ``speculative_config.method`` for the export at ``export_dir``: the engine method
    of its kind (:func:`specdraft.kinds.detect_kind` on its ``config.json``: ``dflash`` for
    :data:`ARCH`). Reads the config only; an unreadable one is the legacy default kind's
    (``eagle3``: the loaders that read the export say what is wrong with it)."""
    try:
        cfg = json.loads((Path(export_dir) / CONFIG).read_text())
    except (OSError, ValueError):
        cfg = {}
    try:
        name = kinds.detect_kind(cfg if isinstance(cfg, dict) else {})
    except InputError:
        name = kinds.LEGACY_DEFAULT
    return kinds.get(name).engine_method or kinds.get(kinds.LEGACY_DEFAULT).engine_method


def engine_config(c: DFlashConfig, dtype: torch.dtype) -> dict[str, Any]:
    """``config.json`` of ``c`` for vLLM (module doc: every key it reads, written explicitly)."""
    return {
        "architectures": [ARCH], "model_type": "qwen3",
        **{k: getattr(c, k) for k in _LAYER},
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "rope_theta": c.rope_theta, "attention_bias": False, "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * c.num_hidden_layers, "use_sliding_window": False,
        "target_hidden_size": c.target_hidden_size, "block_size": c.block_size,
        "dflash_config": {"mask_token_id": c.mask_token_id,
                          "target_layer_ids": list(c.target_layer_ids), "causal": c.causal,
                          "sample_from_anchor": False},
        "specdraft": {"target_num_layers": c.target_num_layers},
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def foreign_keys(cfg: dict[str, Any]) -> list[str]:
    """Keys of a DFlash ``config.json`` that vLLM would compute with and specdraft does not
    implement, each ``key=value`` (empty when all is understood)."""
    bad = []
    for key, value in cfg.items():
        if key in _FIXED:
            if value != _FIXED[key]:
                bad.append(f"{key}={value!r}")
        elif key not in _METADATA and key not in _LAYER and key not in (
                "rope_parameters", "dflash_config"):
            bad.append(f"{key}={value!r} (unknown to specdraft: it may change the computation)")
    for key, value in (cfg.get("dflash_config") or {}).items():
        if key not in _DFLASH_KEYS or (key in _DFLASH_FIXED and value is not _DFLASH_FIXED[key]):
            bad.append(f"dflash_config.{key}={value!r}")
    rope = cfg.get("rope_parameters") or {}
    if set(rope) - {"rope_type", "rope_theta"} or rope.get("rope_type", "default") != "default":
        bad.append(f"rope_parameters={rope!r} (only the default rotary is implemented)")
    if any(t != "full_attention" for t in cfg.get("layer_types") or []):
        bad.append(f"layer_types={cfg['layer_types']!r} (sliding layers)")
    if cfg.get("draft_vocab_size") not in (None, cfg.get("vocab_size")):
        bad.append(f"draft_vocab_size={cfg['draft_vocab_size']!r} (a reduced draft vocab)")
    return bad


def config_from_engine(cfg: dict[str, Any], *, target_num_layers: int | None = None
                       ) -> DFlashConfig:
    """The :class:`DFlashConfig` vLLM computes from ``cfg`` (module doc). ``target_num_layers``
    (the verifier's layer count) is needed when ``cfg`` was not written by specdraft. Raises
    KeyError for a missing key, ValueError naming every foreign key or invalid value."""
    if cfg.get("architectures") != [ARCH]:
        raise ValueError(f"architectures={cfg.get('architectures')!r}, expected [{ARCH!r}]")
    bad = foreign_keys(cfg)
    if bad:
        raise ValueError("field(s) specdraft does not implement: " + "; ".join(bad))
    inner = cfg["dflash_config"]
    causal = bool(cfg["is_causal"]) if cfg.get("is_causal") is not None else \
        bool(inner.get("causal", False))
    n = target_num_layers or (cfg.get("specdraft") or {}).get("target_num_layers")
    if n is None:
        raise KeyError("specdraft.target_num_layers (or pass the verifier's layer count)")
    rope = cfg.get("rope_parameters") or {}
    theta = rope.get("rope_theta", cfg.get("rope_theta"))
    if theta is None:
        raise KeyError("rope_parameters.rope_theta")  # vLLM would default to 1e6: never guessed
    if cfg.get("block_size") is None:  # vLLM does not read it; specdraft never guesses it
        raise KeyError("block_size (the drafter's block: num_speculative_tokens + 1; write it "
                       "as trained)")
    return DFlashConfig(**{k: cfg[k] for k in _LAYER}, rope_theta=float(theta),
                        target_hidden_size=cfg.get("target_hidden_size") or cfg["hidden_size"],
                        target_num_layers=int(n),
                        target_layer_ids=tuple(inner["target_layer_ids"]),
                        mask_token_id=int(inner["mask_token_id"]),
                        block_size=int(cfg["block_size"]), causal=causal)


def expected_shapes(c: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the checkpoint of ``c`` must hold."""
    return {k: tuple(v.shape) for k, v in DFlashDraftModel(c).checkpoint_state().items()}


def export_problems(model: DFlashDraftModel, cfg: dict[str, Any],
                    tensors: dict[str, torch.Tensor]) -> list[str]:
    """Everything wrong with writing ``cfg`` + ``tensors`` for ``model``: the config read back as
    vLLM reads it must equal the model's config (computation fields and shape), and the tensors
    must be exactly the expected names and shapes, finite."""
    out = list(config_problems(model.config))
    try:
        read = config_from_engine(cfg)
    except (KeyError, ValueError) as err:
        return out + [f"config.json as vLLM reads it: {err}"]
    meta = {"verifier_profile": None, "verifier_identity": None}  # provenance, not computation
    want = {**model.config.to_dict(), **meta}
    got = {**read.to_dict(), **meta}
    out += [f"{k}: vLLM would read {got[k]!r}, the drafter computes {want[k]!r}"
            for k in want if want[k] != got[k]]
    shapes = expected_shapes(model.config)
    have = {k: tuple(v.shape) for k, v in tensors.items()}
    out += [f"tensor {k}: missing" for k in sorted(set(shapes) - set(have))]
    out += [f"tensor {k}: not a DFlash checkpoint tensor" for k in sorted(set(have) - set(shapes))]
    out += [f"tensor {k}: shape {have[k]}, expected {shapes[k]}"
            for k in sorted(set(shapes) & set(have)) if have[k] != shapes[k]]
    out += [f"tensor {k}: not finite" for k, v in tensors.items() if not torch.isfinite(v).all()]
    return out


class DFlashExportRefused(InputError):
    """The export would not be served as trained; nothing was written."""


def export_dflash(model: DFlashDraftModel, out: str | Path, *,
                  dtype: torch.dtype | None = None) -> Path:
    """Write ``model`` to ``out`` in vLLM's DFlash format, atomically, after
    :func:`export_problems` found nothing (else :class:`DFlashExportRefused` listing all)."""
    dtype = dtype or model.fc.weight.dtype
    tensors = {k: v.detach().to(dtype).cpu().contiguous()
               for k, v in model.checkpoint_state().items()}
    cfg = engine_config(model.config, dtype)
    problems = export_problems(model, cfg, tensors)
    if problems:
        raise DFlashExportRefused(f"{out}: DFlash export refused:\n  " + "\n  ".join(problems))
    with atomic_dir(out) as tmp:
        atomic_write_json(tmp / CONFIG, cfg)
        atomic_save_safetensors(tensors, tmp / WEIGHTS, metadata={"format": "pt"})
    return Path(out)


def read_dflash(path: str | Path, *, target_num_layers: int | None = None
                ) -> tuple[DFlashConfig, dict[str, torch.Tensor]]:
    """A DFlash export read back: its config (as vLLM computes it) and tensors. Raises
    :class:`InputError` naming the file and the key / tensor at fault."""
    path = Path(path)
    try:
        cfg = json.loads((path / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise InputError(f"{path / CONFIG}: not readable as JSON ({err})") from None
    try:
        config = config_from_engine(cfg, target_num_layers=target_num_layers)
    except KeyError as err:
        raise InputError(f"{path / CONFIG}: missing key {err} for a DFlash drafter") from None
    except (TypeError, ValueError) as err:
        raise InputError(f"{path / CONFIG}: not a DFlash drafter specdraft implements ({err})"
                         ) from None
    try:
        tensors = load_file(str(path / WEIGHTS))
    except (SafetensorError, OSError, ValueError) as err:
        raise InputError(f"{path / WEIGHTS}: not a readable safetensors file ({err})") from None
    shapes = expected_shapes(config)
    have = {k: tuple(v.shape) for k, v in tensors.items()}
    if have != shapes:
        diff = sorted(set(have) ^ set(shapes)) + sorted(
            k for k in set(have) & set(shapes) if have[k] != shapes[k])
        raise InputError(f"{path / WEIGHTS}: tensors differ from a DFlash checkpoint of this "
                         f"config.json: {diff}")
    return config, tensors


def load_dflash(path: str | Path, verifier: Any, *, dtype: torch.dtype = torch.float32
                ) -> DFlashDraftModel:
    """The exported drafter at ``path`` as a model, with the HF ``verifier``'s embedding and
    head (what vLLM shares), in ``dtype``, eval mode."""
    config, tensors = read_dflash(path, target_num_layers=verifier.config.num_hidden_layers)
    model = DFlashDraftModel(config)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and all(m.startswith(("rotary.", "embed_tokens.", "lm_head."))
                                  for m in missing), (missing, unexpected)
    model.set_verifier_tables(verifier)
    return model.to(dtype).eval()
