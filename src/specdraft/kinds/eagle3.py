"""The EAGLE-3 kind's home: one draft layer unrolled over TTT steps (arXiv 2503.01840).

Model and config: :mod:`specdraft.models.eagle3` (the Llama and Qwen3 layers, EAGLE-3.1's
norms) and :mod:`specdraft.models.eagle3_mla` (the MLA layer); objective
:class:`specdraft.train.objective.TTTObjective`; offline decoder
:func:`specdraft.eval.run.decode_eagle3`; export formats the table of
:mod:`specdraft.artifacts.formats` (SGLang, vLLM, speculators) and, for the MLA layer, vLLM's
``Eagle3DeepseekV2ForCausalLM`` layout; vLLM method ``eagle3``.

The draft layer is an option of this kind, not a kind: :data:`LAYERS` is its one table (config
class, model class, engine export, whether the export holds ``t2d``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from specdraft.artifacts.drafter import check_keys as _check_keys, read_export_format
from specdraft.artifacts.export import Candidate, ExportRequest, drafter_profile, \
    embed_problems, export_tensors, identity_problems, missing_facts, profile_problems
from specdraft.artifacts.formats import build_config, drafter_config_from_export
from specdraft.artifacts.validate import ExportRefused, check_export
from specdraft.core.errors import InputError
from specdraft.core.verifier_identity import drafter_identity
from specdraft.engines.vllm_names import installed_mapper
from specdraft.models import eagle3_mla as mla
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel, resolve_draft_layer


@dataclass(frozen=True)
class Layer:
    """One draft layer of the EAGLE-3 kind: ``config`` / ``model`` classes, ``engine_format``
    (the format eval exports it in for an engine) and ``own_config`` (a ``config.json`` builder
    of its own instead of the :mod:`~specdraft.artifacts.formats` table: vLLM only). What its
    export holds and how its layout is checked, the config class says (``export_t2d``,
    ``attention_shapes``, ``layout_problems``)."""

    config: type
    model: type
    engine_format: str = "sglang"
    own_config: Callable[..., dict[str, Any]] | None = None


LAYERS: dict[str, Layer] = {
    "llama": Layer(Eagle3Config, Eagle3DraftModel),
    "qwen3": Layer(Eagle3Config, Eagle3DraftModel),
    "mla": Layer(mla.Eagle3MLAConfig, mla.Eagle3MLADraftModel, engine_format="vllm",
                 own_config=mla.vllm_config),
}


def layer_of(raw: dict[str, Any]) -> Layer:
    """The layer a config dict describes: its ``draft_layer``; the MLA layer by its latent
    width ``kv_lora_rank`` (vLLM's MLA export has no ``draft_layer``; an architecture alone
    does not decide: a Llama layout under the MLA class is refused by the contract, by name)."""
    if "kv_lora_rank" in raw:
        return LAYERS["mla"]
    return LAYERS["mla"] if raw.get("draft_layer") == "mla" else LAYERS["llama"]


def config_from_dict(raw: dict[str, Any]) -> Eagle3Config:
    """The config of ``raw`` (``drafter_config.json``), of its layer's class; strict."""
    return layer_of(raw).config.from_dict(raw)


def check_keys(path: Path, raw: dict[str, Any]) -> None:
    """Missing and unknown keys named (:func:`specdraft.artifacts.drafter.check_keys`)."""
    _check_keys(path, raw, layer_of(raw).config)


def model(config: Eagle3Config) -> Eagle3DraftModel:
    """A fresh drafter of ``config``'s layer."""
    return LAYERS[config.draft_layer].model(config)


def build(options: Any, profile: Any, source: Any, head: dict[str, torch.Tensor],
          d2t: torch.Tensor, t2d: torch.Tensor, identity: dict[str, Any] | None
          ) -> Eagle3DraftModel:
    """A fresh drafter shaped from the verifier's profile (:meth:`Eagle3Config.from_profile`:
    its shape rules), ``embed_tokens`` copied (frozen), d2t/t2d set; the profile and the
    verifier's ``identity`` travel in the drafter's config (``train/best``, ``train/last``).

    ``options`` (the train config): ``drafter_layer`` (``auto``: :func:`resolve_draft_layer`),
    the EAGLE-3.1 norms, ``attn_impl``, ``seed`` and ``lm_head_init``: ``verifier`` (default)
    starts ``lm_head`` [K, H] at the verifier's rows of the draft vocabulary,
    ``head["lm_head.weight"][arange(K) + d2t]``, so the drafter starts from the verifier's own
    read-out of a final hidden state; ``verifier-frozen`` also takes ``lm_head`` out of the
    optimizer (speculators 0.9.0 ``_load_verifier_weights`` does that); ``random`` keeps
    ``nn.Linear``'s init. Measured on the quality benchmark (docs/benchmarks.md "Quality").

    Raises :class:`InputError` when the source's hidden size or vocab size disagree."""
    layer = resolve_draft_layer(options.drafter_layer, profile.model_type)
    config = LAYERS[layer].config.from_profile(
        profile, draft_vocab_size=d2t.numel(), aux_layer_ids=tuple(source.aux_layer_ids),
        attn_impl=options.attn_impl, norm_before_residual=options.norm_before_residual,
        norm_before_fc=options.norm_before_fc, fc_norm=options.fc_norm,
        norm_output=options.norm_output, draft_layer=layer, verifier_identity=identity)
    if source.hidden_size != config.target_hidden_size or t2d.numel() != config.vocab_size:
        raise InputError(f"verifier hidden/vocab {config.target_hidden_size}/"
                         f"{config.vocab_size} but source hidden {source.hidden_size}, "
                         f"t2d over {t2d.numel()} ids")
    torch.manual_seed(options.seed)
    drafter = model(config_from_dict(config.to_dict()))
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(head["embed_tokens.weight"].float())
        drafter.d2t.copy_(d2t)
        drafter.t2d.copy_(t2d)
        if options.lm_head_init != "random":
            target_ids = drafter.draft_to_target(torch.arange(d2t.numel()))
            drafter.lm_head.weight.copy_(head["lm_head.weight"][target_ids].float())
    drafter.lm_head.weight.requires_grad_(options.lm_head_init != "verifier-frozen")
    return drafter


def read_export(path: Path, raw: dict[str, Any]
                ) -> tuple[Eagle3Config, dict[str, torch.Tensor], str]:
    """An exported EAGLE-3 drafter: ``(config, tensors under our names, format)``. The MLA
    export's ``t2d`` (not written: the image of ``d2t``) is rebuilt from ``d2t``."""
    layer = layer_of(raw)
    build = (lambda fmt: mla.config_from_vllm(raw)) if layer.own_config else \
        (lambda fmt: drafter_config_from_export(raw, fmt))
    cfg, state, fmt = read_export_format(path, raw, build)
    if not cfg.export_t2d and "t2d" not in state and "d2t" in state:
        d2t = state["d2t"].long()
        t2d = torch.zeros(int(raw["vocab_size"]), dtype=torch.bool)
        t2d[torch.arange(d2t.numel()) + d2t] = True
        state["t2d"] = t2d
    return cfg, state, fmt


def shared_tables() -> tuple[str, ...]:
    """The verifier tables an export may omit (the engines share the verifier's)."""
    return ("embed_tokens.weight",)


def mla_problems(c: Any, verifier: Any) -> list[str]:
    """An MLA drafter's latent and rope widths and rotary against the verifier's
    (``--verifier``): :meth:`specdraft.models.eagle3_mla.Eagle3MLAConfig.from_profile` copies them
    from the verifier, so a difference means a drafter shaped for another verifier or an edited
    config; each field named with both values."""
    if verifier is None:
        return []
    m = verifier.mla
    if m is None:
        return [f"an MLA drafter, but the verifier ({verifier.model_type}) has no MLA "
                f"(kv_lora_rank): serve an MLA drafter only on an MLA verifier; train "
                f"--drafter-layer llama for this one"]
    pairs = [(f, getattr(c, f), getattr(m, f)) for f in
             ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
             if f != "q_lora_rank" or m.q_lora_rank is not None]  # else the drafter's own
    rope = verifier.rotary.rope_parameters()
    pairs.append(("rope", c.rope_parameters(), rope))
    return [f"the MLA drafter's {f} is {mine!r}, the verifier's {theirs!r}: it was shaped for "
            f"another verifier; retrain it (train --drafter-layer mla) against this one"
            for f, mine, theirs in pairs if mine != theirs]


def candidate(config: ExportRequest, c: Eagle3Config, trained: dict[str, torch.Tensor],
              facts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, tensors) of the export, in memory: the format table's config, or the
    layer's own layout (MLA: vLLM's, which has no ``t2d``)."""
    layer = LAYERS[c.draft_layer]
    embed = facts["embed"] if config.embed != "omit" else None
    if layer.own_config is not None:  # one layout (layout_problems refuses other formats)
        cfg = layer.own_config(c)
    else:
        cfg = build_config(config.format, c, verifier_name=facts["verifier_name"] or "",
                           verifier_architectures=facts["architectures"],
                           speculative_tokens=config.speculative_tokens)
    if config.dtype != "auto":
        cfg["torch_dtype"] = config.dtype
    else:
        first = next(v for v in trained.values() if v.is_floating_point())
        cfg["torch_dtype"] = str(first.dtype).removeprefix("torch.")
    tensors = export_tensors(config.format, trained, embed, config.dtype)
    if not c.export_t2d:
        tensors = {k: v for k, v in tensors.items() if k != "t2d"}
    return cfg, tensors


def export_candidate(config: ExportRequest, src: Any, facts: dict[str, Any]) -> Candidate:
    """The export of an EAGLE-3 drafter in ``config.format``, with every check run
    (:func:`specdraft.artifacts.validate.check_export` and the binding checks). Raises
    :class:`ExportRefused` listing every problem."""
    cfg, tensors = candidate(config, src.config, src.state, facts)
    profile = drafter_profile(src.config, facts)
    problems = missing_facts(config, src.state, src.config, facts)
    problems += profile_problems(config, profile, facts)
    if src.config.draft_layer == "mla":
        problems += mla_problems(src.config, facts["verifier_profile"])
    identity = drafter_identity(src.path, src.config) or facts["extract_identity"]
    more, binding = identity_problems(config, identity, facts)
    problems += more
    problems += embed_problems(config, src.state, facts["embed"])
    problems += check_export(config.format, cfg, tensors, src.config, trained=src.state,
                             verifier_embed=facts["embed"], extract_ids=facts["extract_ids"],
                             n_layers=facts["n_layers"], names=installed_mapper())
    if problems:
        raise ExportRefused(problems)
    aux = {"top_level": cfg.get("eagle_aux_hidden_state_layer_ids"),
           "eagle_config": (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")}
    return Candidate(cfg, tensors, facts, profile, identity, binding, aux)


def engine_format(config: Eagle3Config) -> str:
    """The format eval exports a specdraft drafter in for an engine: SGLang's (every engine
    loads it) unless the layer is served by vLLM only (MLA)."""
    return LAYERS[config.draft_layer].engine_format


def doctor(drafter: Any) -> str | None:
    """None: the doctor's checks (:mod:`specdraft.artifacts.checks`) are this kind's."""
    return None


def engine_hints() -> list[str]:
    """The usual causes of an offline/engine gap when every doctor check passes."""
    return ["doctor: every check passes; the usual causes are dtype (bf16 rounds argmax "
            "ties differently from float32), GPU kernels and batch composition: rerun "
            "with --dtype float32, or raise --engine-tolerance"]


def run_defaults(sections: dict[str, dict[str, Any]], path: Any) -> None:
    """``specdraft run``: no default of the EAGLE-3 kind differs from the stages' own."""
