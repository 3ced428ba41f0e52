"""The drafter contract: which config fields change what a drafter computes, what each engine
computes when a field is absent or not read, and the refusals that follow.

Two rules (docs/drafters.md "The drafter contract"):

1. Every field of :data:`specdraft.models.eagle3.COMPUTATION_FIELDS` is written explicitly, with
   the trained value, in every export format (:mod:`specdraft.artifacts.formats`), and an export
   whose engine would not read a field the drafter needs is refused (:func:`export_problems`).
2. Reading a drafter config written by any tool (:func:`check_foreign_keys`, used by
   :mod:`specdraft.artifacts.drafter` for eval, doctor and export) accepts a key only when specdraft
   implements it, when it is metadata that cannot change the computation, or when its value is
   the one specdraft computes anyway; any other key is refused by name.

:data:`ENGINE_READS` is the one table of each engine version's behaviour for the computation
fields, read from the engines' source (facts only):

- ``vllm-native``: vLLM 0.32 loading an ``LlamaForCausalLMEagle3`` / ``Eagle3Qwen3ForCausalLM``
  ``config.json`` (``model_executor/models/llama_eagle3.py``, ``qwen3_eagle3.py``): reads
  ``norm_before_residual``, ``norm_before_fc`` (``eagle_config``'s first, then top level),
  ``fc_norm`` and ``norm_output``, each default false; the layer from ``architectures``
  (``model_executor/models/registry.py``: ``Eagle3Qwen3ForCausalLM`` -> ``qwen3_eagle3``).
- ``vllm-speculators``: vLLM 0.32 loading a speculators-format ``config.json``
  (``transformers_utils/configs/speculators/algos.py`` ``update_eagle3``): the same fields, but
  ``norm_before_residual`` defaults to **true**; the layer from
  ``transformer_layer_config.model_type`` (``qwen3`` -> ``Eagle3Qwen3ForCausalLM``, ``llama`` ->
  ``Eagle3LlamaForCausalLM``).
- ``sglang``: SGLang ``python/sglang/srt/models/llama_eagle3.py`` (the version read for
  ``../shared/reference/eagle3-facts.md``): one entry class, the Llama layer; residual fixed as
  the feature before ``hidden_norm``; none of the EAGLE-3.1 norms (their tensors would be
  dropped silently as unmatched names). Every field is "not read", at the value it always
  computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdraft.models.eagle3 import COMPUTATION_FIELDS, Eagle3Config


@dataclass(frozen=True)
class Reads:
    """How one engine treats one computation field: ``read`` (False: never read, the engine
    always computes ``value``) and ``value``, what it computes when the key is absent."""

    value: Any
    read: bool = True


_NORMS_OFF = {"norm_before_fc": Reads(False), "fc_norm": Reads(False),
              "norm_output": Reads(False)}
ENGINE_READS: dict[str, dict[str, Reads]] = {
    "vllm-native": {"norm_before_residual": Reads(False), **_NORMS_OFF,
                    "draft_layer": Reads("llama")},
    "vllm-speculators": {"norm_before_residual": Reads(True), **_NORMS_OFF,
                         "draft_layer": Reads("llama")},
    "sglang": {"norm_before_residual": Reads(False, read=False),
               "norm_before_fc": Reads(False, read=False), "fc_norm": Reads(False, read=False),
               "norm_output": Reads(False, read=False), "draft_layer": Reads("llama", read=False)},
}
assert all(set(t) == set(COMPUTATION_FIELDS) for t in ENGINE_READS.values())

# Which engine readers load each export format (formats.build_config): the ``sglang`` format is
# also loaded by vLLM (it reads the top-level ids), ``vllm`` only by vLLM.
FORMAT_READERS: dict[str, tuple[str, ...]] = {
    "sglang": ("sglang", "vllm-native"), "vllm": ("vllm-native",),
    "speculators": ("vllm-speculators",)}


def export_problems(fmt: str, c: Eagle3Config) -> list[str]:
    """One problem per (engine, field) where an engine that loads ``fmt`` would not read a
    computation field whose trained value differs from what that engine always computes."""
    problems = []
    for engine in FORMAT_READERS[fmt]:
        for name, reads in ENGINE_READS[engine].items():
            value = getattr(c, name)
            if not reads.read and value != reads.value:
                problems.append(
                    f"the drafter was trained with {name}={value!r}, but {engine} does not read "
                    f"{name} (it always computes {reads.value!r}) and would serve another "
                    f"drafter than the one measured: export --format vllm")
    return problems


# Drafter layer by the class an engine instantiates (vLLM ``model_executor/models/registry.py``;
# the speculators loader maps ``transformer_layer_config.model_type`` llama/qwen3 to the two).
LAYER_BY_ARCH = {"LlamaForCausalLMEagle3": "llama", "Eagle3LlamaForCausalLM": "llama",
                 "Eagle3Qwen3ForCausalLM": "qwen3"}
LAYER_BY_MODEL_TYPE = {"llama": "llama", "qwen3": "qwen3"}


def engine_computation(cfg: dict[str, Any], engine: str) -> dict[str, Any]:
    """What ``engine`` computes for each computation field from ``config.json`` ``cfg`` (the
    key when present and read, else the engine's value from :data:`ENGINE_READS`).

    Raises ValueError naming an architecture or layer ``model_type`` with no drafter layer here,
    or a field that is not a JSON boolean.
    """
    table = ENGINE_READS[engine]
    out = {n: cfg[n] if r.read and n in cfg else r.value for n, r in table.items()}
    if engine == "vllm-native":
        eagle = cfg.get("eagle_config") or {}
        out["norm_before_fc"] = eagle.get("norm_before_fc", out["norm_before_fc"])
        archs = cfg.get("architectures") or ["LlamaForCausalLMEagle3"]
        unknown = [a for a in archs if a not in LAYER_BY_ARCH]
        if unknown:
            raise ValueError(f"architectures {unknown}: specdraft implements only "
                             f"{sorted(LAYER_BY_ARCH)}")
        out["draft_layer"] = LAYER_BY_ARCH[archs[0]]
    elif engine == "vllm-speculators":
        model_type = (cfg.get("transformer_layer_config") or {}).get("model_type", "llama")
        if model_type not in LAYER_BY_MODEL_TYPE:
            raise ValueError(f"transformer_layer_config.model_type {model_type!r}: specdraft "
                             f"implements only {sorted(LAYER_BY_MODEL_TYPE)}")
        out["draft_layer"] = LAYER_BY_MODEL_TYPE[model_type]
    not_bool = [f"{n}={v!r}" for n, v in out.items() if n != "draft_layer"
                and not isinstance(v, bool)]
    if not_bool:
        raise ValueError(f"{', '.join(not_bool)}: must be true or false")
    return out


def check_contract(fmt: str, cfg: dict[str, Any], c: Eagle3Config) -> list[str]:
    """Problems of a candidate ``config.json`` for ``fmt``: a computation field not written
    explicitly, an engine reading ``fmt`` that would compute another value than the trained
    one from ``cfg``, and :func:`export_problems`."""
    flat = {**cfg.get("transformer_layer_config", {}), **cfg}
    problems = [f"config.json: computation field {n!r} not written explicitly (trained value "
                f"{getattr(c, n)!r})" for n in COMPUTATION_FIELDS
                if n != "draft_layer" and n not in flat]
    for engine in FORMAT_READERS[fmt]:
        try:
            served = engine_computation(cfg, engine)
        except ValueError as err:
            problems.append(f"{engine}: {err}")
            continue
        problems += [f"{engine} would compute {n}={served[n]!r} from config.json, the drafter "
                     f"was trained with {n}={getattr(c, n)!r}"
                     for n in COMPUTATION_FIELDS if ENGINE_READS[engine][n].read
                     and served[n] != getattr(c, n)]
    return problems + export_problems(fmt, c)


# ------------------------------------------------------------------ reading foreign configs
# Keys that describe the checkpoint but cannot change what the drafter computes at inference:
# transformers' generic PretrainedConfig keys, token ids, training-only settings, provenance.
INERT_KEYS = frozenset({
    "_name_or_path", "architectures", "chunk_size_feed_forward", "dtype", "torch_dtype",
    "id2label", "label2id", "is_encoder_decoder", "output_attentions", "output_hidden_states",
    "problem_type", "return_dict", "transformers_version", "bos_token_id", "eos_token_id",
    "pad_token_id", "initializer_range", "use_cache", "attention_dropout", "embed_requires_grad",
    "speculators_version", "speculators_model_type", "speculators_config",
    "sliding_window", "max_window_layers",  # the window matters only via layer_types (below)
    "auto_map"})  # transformers' remote-code pointer (speculators 0.9 writes one); engines and
#                   specdraft build the drafter from its architecture, never from that code

# Keys specdraft reads into Eagle3Config (formats.drafter_config_from_export), plus the
# container keys of the formats.
IMPLEMENTED_KEYS = frozenset({
    "model_type", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "hidden_act", "rms_norm_eps", "rope_theta", "rope_scaling",
    "rope_parameters", "partial_rotary_factor", "max_position_embeddings", "vocab_size",
    "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "eagle_config",
    "transformer_layer_config", *COMPUTATION_FIELDS})


def _fixed_values(n_aux: int) -> dict[str, Any]:
    """Keys an engine reads that specdraft implements at one value only."""
    return {"num_hidden_layers": 1, "num_aux_hidden_states": n_aux, "num_aux_layers": n_aux,
            "logit_scale": 1.0, "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": False, "use_sliding_window": False, "pretraining_tp": 1}


def check_foreign_keys(layer: dict[str, Any], top: dict[str, Any], n_aux: int) -> list[str]:
    """Keys of a drafter ``config.json`` specdraft cannot honour, each named with its value.

    ``layer``: the layer keys (the whole config for the native formats,
    ``transformer_layer_config`` for speculators); ``top``: the top-level keys (the same dict
    for the native formats). ``eagle_config`` may only hold the aux ids, ``use_aux_hidden_state:
    true`` and ``norm_before_fc``; ``layer_types`` only full attention.
    """
    fixed = _fixed_values(n_aux)
    bad = []
    for key, value in {**layer, **top}.items():
        if key in INERT_KEYS or key in IMPLEMENTED_KEYS:
            continue
        if key in fixed:
            if value != fixed[key]:
                bad.append(f"{key}={value!r} (specdraft implements only {fixed[key]!r})")
        elif key == "layer_types":
            if any(t != "full_attention" for t in value or []):
                bad.append(f"layer_types={value!r} (specdraft implements only full_attention)")
        else:
            bad.append(f"{key}={value!r} (unknown to specdraft: it may change the drafter's "
                       f"computation)")
    eagle = top.get("eagle_config") or {}
    for key, value in eagle.items():
        if key == "use_aux_hidden_state" and value is not True:
            bad.append(f"eagle_config.use_aux_hidden_state={value!r} (specdraft implements "
                       f"only true)")
        elif key not in ("use_aux_hidden_state", "eagle_aux_hidden_state_layer_ids",
                         "norm_before_fc"):
            bad.append(f"eagle_config.{key}={value!r} (unknown to specdraft)")
    return bad
