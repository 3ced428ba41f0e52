"""Engine checkpoint formats: one function per format builds ``config.json`` and the weight names.

Every rule below names the engine file it was read from (read for facts only; nothing copied).

Aux-id conventions (the conversions and their table live in :mod:`specdraft.core.aux_ids`).
specdraft's own convention (:data:`specdraft.models.eagle3.AUX_CONVENTION`, the one ``extract``
captures) is "aux id ``i`` = HF ``hidden_states[i]`` = the input to decoder layer ``i``". The
engines read ids as follows:

- **vLLM** (``vllm/v1/spec_decode/eagle/eagle3_utils.py`` → ``get_eagle3_aux_layers_from_config``
  reads the draft config's top-level ``eagle_aux_hidden_state_layer_ids``;
  ``vllm/model_executor/models/interfaces.py`` ``EagleModelMixin._maybe_add_hidden_state`` is
  called with the index of the layer about to run, appending ``hidden_states + residual``): id
  ``j`` = the input to layer ``j``, the same as ours. Identity conversion. Default when absent:
  ``(2, N//2, N-3)`` (``get_eagle3_default_aux_hidden_state_layers`` of the verifier model).
- **SGLang** (``python/sglang/srt/model_executor/model_runner.py`` passes
  ``eagle_config.eagle_aux_hidden_state_layer_ids`` — only that key — to the verifier's
  ``set_eagle3_layers_to_capture``; ``python/sglang/srt/models/llama.py`` captures
  ``hidden_states + residual`` before layer ``c`` for each ``c`` in ``layers_to_capture``). Explicit
  ids were historically shifted by +1 (id ``i`` = output of layer ``i``, captured before layer
  ``i+1``); since SGLang PR #25454 (May 2026) the +1 is applied only when the first id is 1, else
  ids are used as-is. Writing ``ours - 1`` when our first id is 2 (the default set) is read
  identically by both rules. For a first id other than 1 or 2 the two SGLang rules disagree;
  we write the current (post-#25454) reading. A first id of 1 cannot be expressed under the
  current rule (``[0, ...]`` is the embedding, ``[1, ...]`` means ``hidden_states[2]``).
  Default when absent: ``[2, N//2, N-3]`` unshifted.
- **speculators** (``speculators/models/eagle3/core.py`` ``Eagle3DraftModel``; data generation
  through vLLM): top-level ``eagle_aux_hidden_state_layer_ids``, vLLM's meaning. Identity.

Omitting the ids is safe only when the drafter was trained on the default set ``[2, N//2, N-3]``
(both engines then capture exactly those HF ``hidden_states``), which export still writes
explicitly so that nothing depends on an engine default.

fc input width. vLLM and SGLang build ``fc`` as ``3 * target_hidden_size`` (both
``llama_eagle3.py`` files; ``hidden_size`` when ``target_hidden_size`` is absent), so only
3-aux drafters load there; speculators builds it as ``len(eagle_aux_hidden_state_layer_ids) *
transformer_layer_config.hidden_size``. :func:`fc_input_read` mirrors each rule.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch

from specdraft.artifacts.contract import check_foreign_keys, engine_computation
from specdraft.core.aux_ids import hf_to_sglang_ids, hf_to_vllm_ids, sglang_capture_hf_ids, \
    vllm_capture_hf_ids
from specdraft.models.eagle3 import Eagle3Config

FORMATS = ("sglang", "vllm", "speculators")
ENGINE_ARCH = "LlamaForCausalLMEagle3"  # vLLM registry and SGLang EntryClass both accept it
SPECULATORS_ARCH = "Eagle3Speculator"
# Per drafter layer (Eagle3Config.draft_layer): the architecture vLLM's registry maps to that
# layer (``Eagle3Qwen3ForCausalLM`` -> ``qwen3_eagle3.py``) and the layer config's model_type
# (the speculators loader picks the class from it: ``configs/speculators/algos.py``).
ENGINE_ARCHS = {"llama": ENGINE_ARCH, "qwen3": "Eagle3Qwen3ForCausalLM"}
LAYER_MODEL_TYPES = {"llama": "llama", "qwen3": "qwen3"}

# Checkpoint names (ours == the vLLM/SGLang names; speculators renames the decoder layer).
# ``speculators/models/eagle3/core.py``: ``self.layers = ModuleList([first_layer, ...])``.
SPECULATORS_RENAME = {"midlayer.": "layers.0."}


# ------------------------------------------------------------------------ config.json builders
# Rope types both engines' Llama EAGLE-3 layer compute as transformers does (vLLM 0.32
# ``model_executor/layers/rotary_embedding/__init__.py`` ``get_rope``; SGLang ``get_rope``):
# the rest are refused at export with the reason (validate.check_rotary).
ENGINE_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
ROPE_REFUSALS = {
    "dynamic": "dynamic NTK: transformers rescales per sequence length at training time, the "
               "engines cache one fixed scaled table, so the drafter's rotary would differ",
    "longrope": "longrope switches short/long factors by sequence length; not checked to match "
                "between transformers and the engines",
    "proportional": "proportional (Gemma 4) rotary has no Llama EAGLE-3 drafter layer in vLLM or "
                    "SGLang",
}


def rotary_keys(c: Eagle3Config) -> dict[str, Any]:
    """The rotary keys of the draft layer's config, for every engine that reads them:

    - vLLM 0.32 ``model_executor/models/llama.py`` ``LlamaAttention._init_rotary_emb`` calls
      ``get_rope(head_dim, rope_parameters=config.rope_parameters)``: type, theta, scaling
      parameters and ``partial_rotary_factor`` (rotary_dim = ``int(head_dim * factor)``), all
      from ``rope_parameters`` (its transformers also folds legacy ``rope_scaling``,
      ``rope_theta`` and ``partial_rotary_factor`` into it);
    - SGLang ``models/llama.py`` ``LlamaDecoderLayer``/``LlamaAttention``: top-level
      ``rope_theta``, ``rope_scaling`` (the scaling dict, None for none),
      ``partial_rotary_factor`` and ``head_dim``.
    """
    return copy.deepcopy({"rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
                          "partial_rotary_factor": c.partial_rotary_factor,
                          "rope_parameters": c.rope_parameters()})  # transformers edits in place


def llama_layer_config(c: Eagle3Config) -> dict[str, Any]:
    """The Llama layer keys both engines read for the single draft layer (HF ``LlamaConfig``
    names). ``max_position_embeddings`` and ``vocab_size`` are the verifier's;
    ``tie_word_embeddings`` is always false (SGLang would tie lm_head to embed_tokens)."""
    return {
        "model_type": LAYER_MODEL_TYPES[c.draft_layer], "hidden_size": c.hidden_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size, "hidden_act": c.hidden_act,
        "rms_norm_eps": c.rms_norm_eps, **rotary_keys(c),
        "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size, "num_hidden_layers": 1, "attention_bias": False,
        "mlp_bias": False, "tie_word_embeddings": False,
    }


def engine_rope_read(layer: dict[str, Any], reader: str) -> dict[str, Any]:
    """The rotary an engine builds from a draft layer config, as a ``rope_parameters`` dict:
    ``reader`` ``"vllm"`` reads ``rope_parameters`` (legacy keys when it is absent), ``"sglang"``
    the top-level ``rope_theta`` / ``rope_scaling`` / ``partial_rotary_factor`` (see
    :func:`rotary_keys`)."""
    if reader == "vllm" and layer.get("rope_parameters"):
        return dict(layer["rope_parameters"])
    rope = {"rope_type": "default", **(layer.get("rope_scaling") or {}),
            "rope_theta": layer.get("rope_theta", 10000.0)}
    rope.pop("type", None)
    partial = layer.get("partial_rotary_factor", 1.0)
    if partial != 1.0:
        rope["partial_rotary_factor"] = partial
    return rope


def computation_keys(c: Eagle3Config) -> dict[str, bool]:
    """The computation fields every format writes explicitly (``artifacts/contract.py``): the
    engines' defaults differ (``norm_before_residual``: false natively, true through vLLM's
    speculators loader), so nothing is left to a default."""
    return {"norm_before_residual": c.norm_before_residual,
            "norm_before_fc": c.norm_before_fc, "fc_norm": c.fc_norm,
            "norm_output": c.norm_output}


def engine_config(c: Eagle3Config, *, sglang_ids: bool) -> dict[str, Any]:
    """``config.json`` for vLLM and SGLang (``LlamaForCausalLMEagle3``).

    Keys read (``vllm/model_executor/models/llama_eagle3.py``, ``python/sglang/srt/models/
    llama_eagle3.py``): the Llama layer keys, ``draft_vocab_size``, ``target_hidden_size``,
    :func:`computation_keys` (vLLM; written explicitly), ``tie_word_embeddings``
    (SGLang ties lm_head to embed_tokens when true), ``eagle_config.use_aux_hidden_state``.
    Top-level ids are vLLM's; ``eagle_config``'s are SGLang's when ``sglang_ids`` else vLLM's.
    The Qwen3 layer is ``Eagle3Qwen3ForCausalLM`` with ``model_type`` qwen3 (vLLM only).
    """
    ids = list(c.aux_layer_ids)
    inner = hf_to_sglang_ids(ids) if sglang_ids else hf_to_vllm_ids(ids)
    return {
        "architectures": [ENGINE_ARCHS[c.draft_layer]], **llama_layer_config(c),
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        **computation_keys(c),
        "eagle_aux_hidden_state_layer_ids": hf_to_vllm_ids(ids),
        "eagle_config": {"use_aux_hidden_state": True,
                         "eagle_aux_hidden_state_layer_ids": inner},
        "torch_dtype": "bfloat16",
    }


def speculators_config(c: Eagle3Config, *, verifier_name: str,
                       verifier_architectures: list[str],
                       speculative_tokens: int) -> dict[str, Any]:
    """``config.json`` of the speculators format (``speculators/models/eagle3/config.py``
    ``Eagle3SpeculatorConfig``; ``speculators/config.py`` ``SpeculatorsConfig``/``VerifierConfig``;
    ``speculators/proposals/greedy.py``). vLLM detects it by ``speculators_model_type``
    (``vllm/transformers_utils/configs/speculators/``) and defaults ``norm_before_residual`` to
    true there, so every :func:`computation_keys` field is always written; the layer is the
    ``transformer_layer_config.model_type`` (qwen3 -> ``Eagle3Qwen3ForCausalLM`` in vLLM)."""
    return {
        "architectures": [SPECULATORS_ARCH], "speculators_model_type": "eagle3",
        "transformer_layer_config": llama_layer_config(c),
        "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.target_hidden_size,
        **computation_keys(c),
        "eagle_aux_hidden_state_layer_ids": hf_to_vllm_ids(list(c.aux_layer_ids)),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": int(speculative_tokens)}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name,
                         "architectures": list(verifier_architectures)},
        },
        "torch_dtype": "bfloat16",
    }


# ------------------------------------------------------------------------ weight names
def rename(state: dict[str, torch.Tensor], mapping: dict[str, str]) -> dict[str, torch.Tensor]:
    """Apply prefix renames (``{"midlayer.": "layers.0."}``) to checkpoint names."""
    out = {}
    for name, t in state.items():
        for old, new in mapping.items():
            if name.startswith(old):
                name = new + name[len(old):]
        out[name] = t
    return out


def inverse(mapping: dict[str, str]) -> dict[str, str]:
    return {v: k for k, v in mapping.items()}


@dataclass(frozen=True)
class Format:
    """One engine format: its config builder, its rename of our checkpoint names, the rule the
    engine uses to read the aux ids and the fc input width back from ``config.json``."""

    name: str
    rename: dict[str, str]
    read_hf_ids: Callable[[dict[str, Any]], list[int] | None]
    fc_input_read: Callable[[dict[str, Any]], int]


def _vllm_ids(cfg: dict[str, Any]) -> list[int] | None:
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or \
        (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return vllm_capture_hf_ids(ids) if ids else None


def _sglang_ids(cfg: dict[str, Any]) -> list[int] | None:
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return sglang_capture_hf_ids(ids) if ids else None


def _engine_fc_input(cfg: dict[str, Any]) -> int:
    # llama_eagle3.py (vLLM and SGLang): fc = Linear(target_hidden_size * 3, hidden_size)
    return 3 * int(cfg.get("target_hidden_size") or cfg["hidden_size"])


def _speculators_fc_input(cfg: dict[str, Any]) -> int:
    # speculators/models/eagle3/core.py: Linear(num_aux * transformer_layer_config.hidden_size)
    ids = cfg.get("eagle_aux_hidden_state_layer_ids")
    return (len(ids) if ids else 3) * int(cfg["transformer_layer_config"]["hidden_size"])


FORMAT_SPECS: dict[str, Format] = {
    "sglang": Format("sglang", {}, _sglang_ids, _engine_fc_input),
    "vllm": Format("vllm", {}, _vllm_ids, _engine_fc_input),
    "speculators": Format("speculators", SPECULATORS_RENAME, _vllm_ids, _speculators_fc_input),
}


def build_config(fmt: str, c: Eagle3Config, *, verifier_name: str = "",
                 verifier_architectures: list[str] | None = None,
                 speculative_tokens: int = 3) -> dict[str, Any]:
    """``config.json`` for ``fmt`` (one of :data:`FORMATS`). The ``sglang`` default also loads
    in vLLM: vLLM reads the top-level ids, SGLang only ``eagle_config``'s."""
    if fmt == "speculators":
        return speculators_config(c, verifier_name=verifier_name,
                                  verifier_architectures=verifier_architectures or [],
                                  speculative_tokens=speculative_tokens)
    return engine_config(c, sglang_ids=fmt == "sglang")


def detect_format(cfg: dict[str, Any]) -> str:
    """``speculators`` when ``speculators_model_type`` is set (vLLM's own test), else ``sglang``
    when ``eagle_config``'s ids differ from the top-level ones, else ``vllm``."""
    if "speculators_model_type" in cfg:
        return "speculators"
    inner = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    return "sglang" if inner is not None and inner != top else "vllm"


def drafter_config_from_export(cfg: dict[str, Any], fmt: str) -> Eagle3Config:
    """Rebuild :class:`Eagle3Config` from an exported ``config.json`` (ids back in our
    convention, read the way ``fmt``'s engine reads them; the computation fields as vLLM
    computes them from it, :func:`specdraft.artifacts.contract.engine_computation`). Raises
    KeyError on a missing key, ValueError naming every key specdraft does not implement
    (:func:`specdraft.artifacts.contract.check_foreign_keys`)."""
    layer = cfg["transformer_layer_config"] if fmt == "speculators" else cfg
    ids = FORMAT_SPECS[fmt].read_hf_ids(cfg)
    if ids is None:
        raise KeyError("eagle_aux_hidden_state_layer_ids")
    computation = engine_computation(
        cfg, "vllm-speculators" if fmt == "speculators" else "vllm-native")
    if "rope_theta" not in layer and "rope_theta" not in (layer.get("rope_parameters") or {}):
        raise KeyError("rope_theta")  # never a guessed base: 10000 is wrong for most verifiers
    rope = engine_rope_read(layer, "vllm" if layer.get("rope_parameters") else "sglang")
    theta = float(rope.pop("rope_theta"))
    partial = float(rope.pop("partial_rotary_factor", 1.0))
    scaling = rope if rope.get("rope_type", "default") != "default" else None
    config = Eagle3Config(
        hidden_size=layer["hidden_size"], num_attention_heads=layer["num_attention_heads"],
        num_key_value_heads=layer["num_key_value_heads"], head_dim=layer["head_dim"],
        intermediate_size=layer["intermediate_size"], rms_norm_eps=layer["rms_norm_eps"],
        rope_theta=theta, rope_scaling=scaling, partial_rotary_factor=partial,
        max_position_embeddings=layer["max_position_embeddings"],
        vocab_size=layer["vocab_size"], draft_vocab_size=cfg["draft_vocab_size"],
        target_hidden_size=cfg.get("target_hidden_size") or layer["hidden_size"],
        aux_layer_ids=tuple(ids), hidden_act=layer.get("hidden_act", "silu"), **computation)
    bad = check_foreign_keys(layer, cfg, len(ids))  # after the missing keys were named
    if bad:
        raise ValueError("field(s) specdraft does not implement: " + "; ".join(bad))
    return config
