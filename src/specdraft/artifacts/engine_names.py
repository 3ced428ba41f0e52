"""vLLM's weight-name read-back of an EAGLE-3 export: every tensor name of the checkpoint taken
through the engine's own renaming, then matched against the parameters the engine's drafter
class declares for that ``config.json``. An export whose names do not land (a tensor the engine
has no parameter for, a parameter no tensor fills, a fused parameter missing a shard) is refused
before a byte is written: ``validate.check_export`` calls :func:`name_problems`.

Two steps of vLLM 0.32's loading (facts read from its source, no code copied):

1. the ``*ForCausalLM.load_weights`` of ``llama_eagle3.py``, ``qwen3_eagle3.py`` and
   ``deepseek_eagle3.py`` (:func:`outer_name`): a name holding ``t2d`` is skipped; ``d2t``
   becomes ``draft_id_to_target_id``; every other name without ``lm_head`` gets ``model.``;
   then the inner model's ``load_weights`` applies its class's ``hf_to_vllm_mapper``
   (:data:`TABLE_RULES`: ``midlayer.`` -> ``layers.0.`` and the stacked projections).
2. the parameters of the class :data:`INNER_MODELS` names for the architecture
   (:func:`engine_params`, from ``deepseek_v2.py`` ``DeepseekV2MLAAttention``, ``llama.py`` /
   ``qwen3.py`` attention, ``llama_eagle3.py`` ``input_norm`` / ``fc_norm``).

Step 1's inner renaming is run by the installed vLLM when a vLLM python exists
(:mod:`specdraft.engines.vllm_names` runs the class's own ``WeightsMapper``), else by
:func:`table_mapper` (the rules as read from vLLM 0.32; ``tests/export/test_engine_names.py``
checks the table against the installed engine).

The fact this catches (vLLM 0.32 ``deepseek_eagle3.py``): the MLA drafter's mapper stacks
``.kv_a_proj_with_mqa`` into ``.fused_qkv_a_proj`` unconditionally, but
``DeepseekV2MLAAttention`` has ``fused_qkv_a_proj`` only when ``q_lora_rank`` is set; an MLA
drafter with ``q_lora_rank: null`` does not load ("There is no module or parameter named
'layers.0.self_attn.fused_qkv_a_proj'").
"""

from __future__ import annotations

from typing import Any, Callable

#: name -> (engine parameter name, shard id or None); None: the engine skips the name.
Mapped = dict[str, tuple[str, Any] | None]
Mapper = Callable[[str, list[str]], Mapped]

#: vLLM architecture -> "module:class" of the inner model whose ``hf_to_vllm_mapper`` renames
#: (``model_executor/models/registry.py`` maps the architecture to the module).
INNER_MODELS = {
    "LlamaForCausalLMEagle3": "vllm.model_executor.models.llama_eagle3:LlamaModel",
    "Eagle3LlamaForCausalLM": "vllm.model_executor.models.llama_eagle3:LlamaModel",
    "Eagle3Qwen3ForCausalLM": "vllm.model_executor.models.qwen3_eagle3:Qwen3Eagle3Model",
    "Eagle3DeepseekV2ForCausalLM":
        "vllm.model_executor.models.deepseek_eagle3:DeepseekV2Eagle3Model",
}
_QKV = {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"),
        ".v_proj": (".qkv_proj", "v")}
_GATE_UP = {".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}
#: Each inner model's ``hf_to_vllm_mapper`` as vLLM 0.32 writes it: (substring renames, stacked
#: renames ``{substring: (new substring, shard id)}``), applied in that order, first match only.
TABLE_RULES: dict[str, tuple[dict[str, str], dict[str, tuple[str, Any]]]] = {
    INNER_MODELS["LlamaForCausalLMEagle3"]: ({"midlayer.": "layers.0."}, {**_QKV, **_GATE_UP}),
    INNER_MODELS["Eagle3Qwen3ForCausalLM"]: ({"midlayer.": "layers.0."}, {**_QKV, **_GATE_UP}),
    INNER_MODELS["Eagle3DeepseekV2ForCausalLM"]: (
        {"midlayer.": "layers.0."},
        {**_GATE_UP, ".q_a_proj": (".fused_qkv_a_proj", 0),
         ".kv_a_proj_with_mqa": (".fused_qkv_a_proj", 1)}),
}


def outer_name(name: str) -> str | None:
    """Step 1 of the module doc, the ``*ForCausalLM.load_weights`` rename: None for a skipped
    name (``t2d``), else the name the inner model or the head receives."""
    if "t2d" in name:
        return None
    if "d2t" in name:
        return name.replace("d2t", "draft_id_to_target_id")
    return name if "lm_head" in name else "model." + name


def table_mapper(module_class: str, names: list[str]) -> Mapped:
    """The inner ``hf_to_vllm_mapper`` of ``module_class`` (:data:`TABLE_RULES`) applied to
    ``names`` (inner names, without ``model.``): each substring rename then each stacked rename
    whose substring occurs, first occurrence replaced."""
    substr, stacked = TABLE_RULES[module_class]
    out: Mapped = {}
    for name in names:
        new, shard = name, None
        for old, repl in substr.items():
            if old in new:
                new = new.replace(old, repl, 1)
        for old, (repl, sid) in stacked.items():
            if old in new:
                new, shard = new.replace(old, repl, 1), sid
        out[name] = (new, shard)
    return out


def architecture(fmt: str, cfg: dict[str, Any]) -> str | None:
    """The vLLM architecture that loads ``cfg`` written in ``fmt``: ``architectures[0]``, or
    for the speculators format the class its layer ``model_type`` selects
    (``transformers_utils/configs/speculators/algos.py``). None for one vLLM has no EAGLE-3
    class for here."""
    if fmt == "speculators":
        model_type = (cfg.get("transformer_layer_config") or {}).get("model_type", "llama")
        return {"llama": "Eagle3LlamaForCausalLM",
                "qwen3": "Eagle3Qwen3ForCausalLM"}.get(model_type)
    arch = (cfg.get("architectures") or ["LlamaForCausalLMEagle3"])[0]
    return arch if arch in INNER_MODELS else None


def engine_params(arch: str, cfg: dict[str, Any]) -> dict[str, set[Any] | None]:
    """Engine parameter -> the shard ids it needs filled (None: one whole tensor) of the drafter
    vLLM 0.32 builds as ``arch`` from ``cfg`` (module doc, step 2). ``model.embed_tokens`` is
    left out (vLLM shares the verifier's when the checkpoint has none)."""
    layer = cfg.get("transformer_layer_config") or cfg
    at, L = "model.layers.0.self_attn.", "model.layers.0."
    params: dict[str, set[Any] | None] = {
        L + "mlp.gate_up_proj.weight": {0, 1}, L + "mlp.down_proj.weight": None,
        L + "input_layernorm.weight": None, L + "hidden_norm.weight": None,
        L + "post_attention_layernorm.weight": None, at + "o_proj.weight": None,
        "model.fc.weight": None, "model.norm.weight": None, "lm_head.weight": None}
    if arch == "Eagle3DeepseekV2ForCausalLM":  # deepseek_v2.py DeepseekV2MLAAttention
        if layer.get("q_lora_rank") is not None:
            params.update({at + "fused_qkv_a_proj.weight": {0, 1},
                           at + "q_a_layernorm.weight": None, at + "q_b_proj.weight": None})
        else:
            params.update({at + "q_proj.weight": None, at + "kv_a_proj_with_mqa.weight": None})
        params.update({at + "kv_a_layernorm.weight": None, at + "kv_b_proj.weight": None})
    else:
        params[at + "qkv_proj.weight"] = {"q", "k", "v"}
        if arch == "Eagle3Qwen3ForCausalLM":  # qwen3.py Qwen3Attention: per-head q/k norms
            params.update({at + "q_norm.weight": None, at + "k_norm.weight": None})
        eagle = cfg.get("eagle_config") or {}
        if eagle.get("norm_before_fc", cfg.get("norm_before_fc")):
            params["model.input_norm.weight"] = None  # llama_eagle3.py, not the MLA class
    if cfg.get("fc_norm") or layer.get("fc_norm"):
        ids = cfg.get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0]
        params.update({f"model.fc_norm.{i}.weight": None for i in range(len(ids))})
    if cfg.get("draft_vocab_size") not in (None, layer.get("vocab_size")):
        params["draft_id_to_target_id"] = None
    return params


def name_problems(fmt: str, cfg: dict[str, Any], names: list[str], mapper: Mapper,
                  source: str, *, unfilled: bool = True) -> list[str]:
    """Every name of an export that vLLM's loader would not land (module doc): a tensor mapped
    to a parameter the class does not have, a parameter (or shard) no tensor fills. ``mapper``
    runs the inner rename (:func:`table_mapper` or the installed engine's); ``source`` names it
    in each problem. ``unfilled=False``: parameters left empty are not listed (the caller has
    named the missing tensors already)."""
    arch = architecture(fmt, cfg)
    if arch is None:
        return []  # an architecture vLLM has no EAGLE-3 class for is refused by the contract
    module_class = INNER_MODELS[arch]
    outer = {n: outer_name(n) for n in names}
    inner = [o[len("model."):] for o in outer.values() if o and o.startswith("model.")]
    mapped = mapper(module_class, inner)
    params, filled = engine_params(arch, cfg), {}
    problems = []
    for name, o in outer.items():
        if o is None:
            continue
        got = ("model." + mapped[o[6:]][0], mapped[o[6:]][1]) if o.startswith("model.") else \
            (o, None)
        if got[0] == "model.embed_tokens.weight":
            continue
        if got[0] not in params:
            problems.append(
                f"{name}: vLLM's loader ({source}) maps it to {got[0]}, which the "
                f"{arch} it builds from this config.json does not have (vLLM refuses the "
                f"checkpoint: 'There is no module or parameter named ...', or drops the "
                f"tensor)"
                + _cause(arch, cfg, got[0]))
            continue
        filled.setdefault(got[0], set()).add(got[1])
    for param, shards in params.items() if unfilled else ():
        have = filled.get(param)
        if have is None:
            problems.append(f"{param}: no tensor of the export fills this parameter of vLLM's "
                            f"{arch} ({source})")
        elif shards is not None and not shards <= have:
            problems.append(f"{param}: shard(s) {sorted(map(str, shards - have))} not filled "
                            f"by any tensor ({source})")
    return problems


def _cause(arch: str, cfg: dict[str, Any], param: str) -> str:
    if arch == "Eagle3DeepseekV2ForCausalLM" and "fused_qkv_a_proj" in param \
            and cfg.get("q_lora_rank") is None:
        return ("; cause: vLLM 0.32 deepseek_eagle3.py stacks kv_a_proj_with_mqa into "
                "fused_qkv_a_proj unconditionally, and DeepseekV2MLAAttention has that "
                "parameter only with a q_lora_rank: an MLA drafter with q_lora_rank null "
                "cannot load; retrain it (train --drafter-layer mla gives it a low-rank query)")
    if param == "draft_id_to_target_id":
        return ("; cause: the draft vocabulary is the whole vocabulary (draft_vocab_size == "
                "vocab_size), so vLLM's drafter has no draft_id_to_target_id and refuses a d2t "
                "(llama_eagle3.py / deepseek_eagle3.py); build a reduced draft vocabulary "
                "(vocab --draft-vocab-size below the verifier's)")
    return ""
