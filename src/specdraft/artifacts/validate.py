"""Validation of an export before anything is written: every problem is collected, then refused.

The *format manifest* (:func:`required_keys`, :func:`expected_tensors`) lists, per format, the
``config.json`` keys the engine reads and every tensor with its shape and dtype.
:func:`check_export` compares a candidate ``(config.json, tensors)`` against it and against the
facts of the run:

- fc input = n_aux × target hidden, and equal to the width the engine derives from config.json;
- ``lm_head`` rows = draft vocab K; ``d2t`` int64 [K] with ``arange(K) + d2t`` strictly increasing
  inside ``[0, V)``; ``t2d`` bool [V] with K true entries, exactly at ``arange(K) + d2t``;
- the aux ids the engine will read (converted back to HF ``hidden_states`` indices) equal the ids
  used at extraction;
- no missing or unexpected tensor; each tensor identical to the trained one it was taken from;
  ``embed_tokens`` either absent or an exact copy of the verifier's;
- the rotary each engine builds from ``config.json`` (:func:`specdraft.artifacts.formats.
  engine_rope_read`) is the drafter's (type, theta, scaling parameters, partial factor), of a
  type the engines' Llama EAGLE-3 layer computes like transformers (else refused with the
  reason); ``tie_word_embeddings`` is false;
- every computation field is written, each engine that loads the format computes the trained
  value from ``config.json``, and no engine ignores a field the drafter needs
  (:func:`specdraft.artifacts.contract.check_contract`);
- every tensor name lands on a parameter of the class vLLM builds from ``config.json``, through
  vLLM's own renaming, and every parameter is filled
  (:func:`specdraft.artifacts.engine_names.name_problems`).
"""

from __future__ import annotations

from typing import Any

import torch

from specdraft.core.conventions import vocab_map_problems
from specdraft.core.errors import SpecdraftError
from specdraft.artifacts.contract import check_contract
from specdraft.artifacts.engine_names import Mapper, name_problems, table_mapper
from specdraft.artifacts.rules import aux_id_problems, tensor_problems
from specdraft.artifacts.formats import (ENGINE_ROPE_TYPES, FORMAT_SPECS, ROPE_REFUSALS,
                                      engine_rope_read, inverse)
from specdraft.models.eagle3 import Eagle3Config

ENGINE_KEYS = ("architectures", "model_type", "hidden_size", "num_attention_heads",
               "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps",
               "rope_theta", "max_position_embeddings", "vocab_size", "draft_vocab_size",
               "target_hidden_size", "tie_word_embeddings", "norm_before_residual",
               "eagle_aux_hidden_state_layer_ids", "eagle_config.use_aux_hidden_state",
               "eagle_config.eagle_aux_hidden_state_layer_ids")
SPECULATORS_KEYS = ("architectures", "speculators_model_type", "draft_vocab_size",
                    "target_hidden_size", "norm_before_residual",
                    "eagle_aux_hidden_state_layer_ids", "transformer_layer_config.hidden_size",
                    "transformer_layer_config.vocab_size",
                    "transformer_layer_config.max_position_embeddings",
                    "speculators_config.algorithm",
                    "speculators_config.proposal_methods",
                    "speculators_config.default_proposal_method",
                    "speculators_config.verifier.name_or_path",
                    "speculators_config.verifier.architectures")


class ExportRefused(SpecdraftError):
    """The export would not load or would select the wrong tensors; lists every problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(f"export refused, nothing written ({len(problems)} problem"
                         f"{'s' if len(problems) != 1 else ''}): " +
                         " ".join(f"[{i}] {p}" for i, p in enumerate(problems, 1)))


def required_keys(fmt: str) -> tuple[str, ...]:
    """Dotted ``config.json`` keys the format's loader reads (module doc)."""
    return SPECULATORS_KEYS if fmt == "speculators" else ENGINE_KEYS


def expected_tensors(fmt: str, c: Eagle3Config, *, with_embed: bool
                     ) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """Name -> (shape, dtype or None for "any float") of every tensor of the export."""
    H, I, K, V = c.hidden_size, c.intermediate_size, c.draft_vocab_size, c.vocab_size
    ours = {
        "fc.weight": (H, c.n_aux * c.target_hidden_size),
        "midlayer.input_layernorm.weight": (H,), "midlayer.hidden_norm.weight": (H,),
        "midlayer.post_attention_layernorm.weight": (H,),
        **c.attention_shapes(),  # the draft layer's own (Llama, Qwen3 q/k norms, MLA)
        "midlayer.mlp.gate_proj.weight": (I, H), "midlayer.mlp.up_proj.weight": (I, H),
        "midlayer.mlp.down_proj.weight": (H, I), "norm.weight": (H,), "lm_head.weight": (K, H),
    }
    if c.norm_before_fc:  # EAGLE-3.1 (models/eagle3.py): one norm over the concatenation
        ours["input_norm.weight"] = (c.n_aux * c.target_hidden_size,)
    if c.fc_norm:  # one norm per aux chunk
        ours.update({f"fc_norm.{i}.weight": (c.target_hidden_size,) for i in range(c.n_aux)})
    spec: dict[str, tuple[tuple[int, ...], torch.dtype | None]] = {
        n: (s, None) for n, s in ours.items()}
    spec["d2t"] = ((K,), torch.int64)
    if c.export_t2d:  # the MLA layout has no t2d (d2t's image; models/eagle3_mla.py)
        spec["t2d"] = ((V,), torch.bool)
    if with_embed:
        spec["embed_tokens.weight"] = ((V, H), None)
    mapping = FORMAT_SPECS[fmt].rename
    return {_renamed(n, mapping): v for n, v in spec.items()}


def _renamed(name: str, mapping: dict[str, str]) -> str:
    for old, new in mapping.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def get_dotted(d: dict[str, Any], key: str) -> tuple[bool, Any]:
    cur: Any = d
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def check_config_keys(fmt: str, cfg: dict[str, Any]) -> list[str]:
    missing = [k for k in required_keys(fmt) if not get_dotted(cfg, k)[0]]
    return [f"config.json: missing key {k!r} (read by the {fmt} loader)" for k in missing]


def check_tensors(fmt: str, c: Eagle3Config, tensors: dict[str, torch.Tensor]) -> list[str]:
    """Missing / unexpected names, shapes and dtypes against :func:`expected_tensors`."""
    embed_name = _renamed("embed_tokens.weight", FORMAT_SPECS[fmt].rename)
    spec = expected_tensors(fmt, c, with_embed=embed_name in tensors)
    problems = [f"missing tensor {n}" for n in spec if n not in tensors]
    problems += [f"unexpected tensor {n} (the {fmt} loader would fail or drop it)"
                 for n in tensors if n not in spec]
    for n, (shape, dtype) in spec.items():
        t = tensors.get(n)
        if t is None:
            continue
        if tuple(t.shape) != shape:
            problems.append(f"{n}: shape {list(t.shape)}, expected {list(shape)}")
        if dtype is not None and t.dtype != dtype:
            problems.append(f"{n}: dtype {t.dtype}, expected {dtype}")
        elif dtype is None and not t.is_floating_point():
            problems.append(f"{n}: dtype {t.dtype}, expected a float dtype")
    return problems


def check_provenance(fmt: str, tensors: dict[str, torch.Tensor],
                     trained: dict[str, torch.Tensor],
                     verifier_embed: torch.Tensor | None) -> list[str]:
    """Every written tensor equals the trained tensor it was taken from; the embedding, when
    written, equals the verifier's exactly (never a fresh init)."""
    back = inverse(FORMAT_SPECS[fmt].rename)
    problems = []
    for name, t in tensors.items():
        ours = _renamed(name, back)
        if ours == "embed_tokens.weight":
            if verifier_embed is None:
                problems.append("embed_tokens.weight written but the verifier's embedding is "
                                "unknown: cannot prove it is a copy (omit it with --embed omit)")
            elif t.shape != verifier_embed.shape or not torch.equal(t, verifier_embed.to(t.dtype)):
                problems.append("embed_tokens.weight differs from the verifier's embedding "
                                "(SGLang replaces it with the verifier's at load; a drafter "
                                "trained on another embedding loses acceptance)")
        elif ours not in trained:
            problems.append(f"{name}: not in the trained state")
        elif not torch.equal(t, trained[ours].to(t.dtype)):
            problems.append(f"{name}: values differ from the trained state")
    return problems


def check_aux_ids(fmt: str, cfg: dict[str, Any], c: Eagle3Config,
                  extract_ids: list[int] | None, n_layers: int | None) -> list[str]:
    """The ids the engine reads, converted back, equal the drafter's and the extraction's."""
    problems = []
    read = FORMAT_SPECS[fmt].read_hf_ids(cfg)
    if read is None:
        return [f"no aux layer ids where the {fmt} loader reads them"]
    if read != list(c.aux_layer_ids):
        problems.append(f"the {fmt} loader would capture HF hidden_states {read}, the drafter "
                        f"was built for {list(c.aux_layer_ids)}")
    if fmt == "sglang" and c.aux_layer_ids and c.aux_layer_ids[0] == 1:
        problems.append("aux ids starting with 1 (HF hidden_states[1]) have no SGLang spelling: "
                        "since SGLang PR #25454 a first id of 1 means hidden_states[2]; use "
                        "--format vllm or extract with other ids")
    if extract_ids is not None and list(extract_ids) != list(c.aux_layer_ids):
        problems.append(f"aux ids {list(c.aux_layer_ids)} differ from the ids used at extraction "
                        f"{list(extract_ids)} (RUN/extract/manifest.json aux_layer_ids)")
    if n_layers is not None:
        problems += aux_id_problems(c.aux_layer_ids, n_layers, source="drafter aux ids")
    return problems


def check_fc(fmt: str, cfg: dict[str, Any], c: Eagle3Config, tensors: dict[str, torch.Tensor]
             ) -> list[str]:
    fc = tensors.get("fc.weight")
    want = c.n_aux * c.target_hidden_size
    problems = []
    if fc is not None and fc.shape[-1] != want:
        problems.append(f"fc.weight input width {fc.shape[-1]} != n_aux {c.n_aux} x target "
                        f"hidden {c.target_hidden_size} = {want}")
    try:
        read = FORMAT_SPECS[fmt].fc_input_read(cfg)
    except (KeyError, TypeError):
        return problems
    if read != want:
        problems.append(f"the {fmt} loader builds fc with input width {read} from config.json, "
                        f"the checkpoint has {want} ({c.n_aux} aux layers x "
                        f"{c.target_hidden_size}); vLLM and SGLang (llama_eagle3.py) only "
                        f"load 3 aux layers — use "
                        f"--format speculators or train with 3 aux layers")
    return problems


def _layer(fmt: str, cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg.get("transformer_layer_config") or {} if fmt == "speculators" else cfg


def check_rotary(fmt: str, cfg: dict[str, Any], c: Eagle3Config) -> list[str]:
    """The drafter's rotary is one the engines express, and each engine reads it back exactly."""
    problems = []
    rope_type = c.rope_type
    if rope_type not in ENGINE_ROPE_TYPES:
        why = ROPE_REFUSALS.get(rope_type, "not a rope type specdraft has checked in the engines")
        problems.append(f"rotary type {rope_type!r} cannot be served by the engines' EAGLE-3 "
                        f"drafter: {why} (supported: {', '.join(ENGINE_ROPE_TYPES)})")
    if "mrope_section" in (c.rope_scaling or {}):
        problems.append("multimodal rotary (mrope_section): the engines' Llama EAGLE-3 drafter "
                        "would build a 3-D position rotary the drafter was not trained with")
    want = c.rope_parameters()
    readers = ("vllm", "sglang") if fmt != "speculators" else ("vllm",)
    for reader in readers:
        got = engine_rope_read(_layer(fmt, cfg), reader)
        if got != want:
            diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            problems.append(f"the {reader} loader would build rotary {got} from config.json, the "
                            f"drafter was trained with {want} (differs in {diff})")
    layer = _layer(fmt, cfg)
    if layer.get("head_dim") != c.head_dim:
        problems.append(f"config.json head_dim {layer.get('head_dim')} != the drafter's "
                        f"{c.head_dim} (the engines size q/k/v and the rotary by it)")
    if layer.get("tie_word_embeddings") is not False:
        problems.append("config.json tie_word_embeddings must be false: SGLang would replace the "
                        "drafter's lm_head over the draft vocab with embed_tokens")
    return problems


def check_export(fmt: str, cfg: dict[str, Any], tensors: dict[str, torch.Tensor],
                 c: Eagle3Config, *, trained: dict[str, torch.Tensor],
                 verifier_embed: torch.Tensor | None, extract_ids: list[int] | None,
                 n_layers: int | None, names: tuple[Mapper, str] | None = None) -> list[str]:
    """Every problem of a candidate export (empty list = safe to write). See module doc.
    ``names``: ``(mapper, source)`` of vLLM's weight-name renaming
    (:func:`specdraft.engines.vllm_names.installed_mapper`); default specdraft's table."""
    own = c.layout_problems(fmt, cfg)  # a layer with a layout of its own (MLA: vLLM's)
    if own:
        return own
    if own is not None:  # its own layout checked; the tensors, ids and vocab as below
        problems = check_tensors(fmt, c, tensors) + check_fc(fmt, cfg, c, tensors)
    else:
        problems = check_config_keys(fmt, cfg)
        problems += check_tensors(fmt, c, tensors)
        problems += check_fc(fmt, cfg, c, tensors)
        problems += check_rotary(fmt, cfg, c)
        problems += check_contract(fmt, cfg, c)
    head = tensors.get("lm_head.weight")
    if head is not None and head.shape[0] != c.draft_vocab_size:
        problems.append(f"lm_head.weight has {head.shape[0]} rows, draft vocab is "
                        f"{c.draft_vocab_size}")
    t2d = tensors.get("t2d") if c.export_t2d else trained.get("t2d")
    problems += vocab_map_problems(tensors.get("d2t"), t2d, c.draft_vocab_size, c.vocab_size)
    problems += check_aux_ids(fmt, cfg, c, extract_ids, n_layers)
    problems += check_provenance(fmt, tensors, trained, verifier_embed)
    named = {p.split(" (")[0] for p in problems}  # the table above names a tensor once
    problems += [p for p in tensor_problems(c, trained, shared=("embed_tokens.weight",))
                 if p.split(" (")[0] not in named]
    mapper, source = names or (table_mapper, "specdraft's table of vLLM 0.32")
    missing = any(p.startswith("missing tensor") for p in problems)  # named once, above
    problems += name_problems(fmt, cfg, list(tensors), mapper, source, unfilled=not missing)
    return list(dict.fromkeys(problems))
