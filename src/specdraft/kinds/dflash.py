"""The DFlash kind's home: block drafting, Qwen3 layers drafting a whole block of mask slots in
one forward (vLLM 0.32 ``qwen3_dflash.py``; docs/drafters.md "DFlash").

Model and config: :mod:`specdraft.models.dflash`; objective
:class:`specdraft.train.dflash_objective.DFlashObjective`; offline decoder
:func:`specdraft.eval.dflash.decode_offline`; one engine format, vLLM's native DFlash
(:mod:`specdraft.artifacts.dflash_export`); vLLM method ``dflash``. Run defaults: exported
``--format vllm``, evaluated with ``k`` = block size - 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specdraft.artifacts.dflash_export import engine_config, export_problems, read_dflash
from specdraft.artifacts.export import Candidate, ExportRequest, drafter_profile, \
    embed_problems, identity_problems, profile_problems
from specdraft.artifacts.validate import ExportRefused
from specdraft.core.errors import ConfigError, InputError
from specdraft.core.verifier_identity import drafter_identity
from specdraft.kinds import DFLASH_BLOCK_SIZE
from specdraft.models.dflash import DFlashConfig, DFlashDraftModel, init_normal_, \
    spread_target_layer_ids


def config_from_dict(raw: dict[str, Any]) -> DFlashConfig:
    """The config of ``raw`` (``drafter_config.json``); strict, names every unknown key."""
    return DFlashConfig.from_dict(raw)


def check_keys(path: Path, raw: dict[str, Any]) -> None:
    """Nothing beyond :meth:`DFlashConfig.from_dict`, which names every key it does not
    implement."""


def model(config: DFlashConfig) -> DFlashDraftModel:
    """A fresh DFlash drafter of ``config``."""
    return DFlashDraftModel(config)


def target_layer_ids(aux: list[int]) -> list[int]:
    """HF ``hidden_states`` indices (the run's aux ids) -> DFlash's layer-output ids
    (:func:`specdraft.core.aux_ids.hf_to_dflash_target_ids`, the table of every aux-id
    convention; vLLM adds the 1 back when it serves it)."""
    from specdraft.core.aux_ids import hf_to_dflash_target_ids

    return hf_to_dflash_target_ids(aux)


def build(options: Any, profile: Any, source: Any, head: dict[str, torch.Tensor],
          d2t: torch.Tensor, t2d: torch.Tensor, identity: dict[str, Any] | None
          ) -> DFlashDraftModel:
    """A fresh DFlash drafter shaped from the verifier's profile, reading the source's aux
    layers (:func:`target_layer_ids`); the verifier's embedding and head are copied into the
    frozen tables (the draft vocabulary ``d2t``/``t2d`` is not used: DFlash reads out with the
    verifier's full head). ``options``: the train config's ``dflash_*`` fields and ``seed``;
    ``dflash_target_layers`` ``spread`` checks the run's aux layers against
    :func:`~specdraft.models.dflash.spread_target_layer_ids`, ``dflash_init_std`` redraws the
    linear weights (:func:`~specdraft.models.dflash.init_normal_`).

    Raises :class:`ConfigError` when an aux id has no layer-output id (0, the embeddings, or the
    last layer's post-norm state) or the verifier's shape is not one the DFlash layer implements,
    :class:`InputError` when the source's hidden size or vocab differ from the verifier's."""
    n = profile.n_layers
    aux = list(source.aux_layer_ids)
    if any(a < 1 or a > n - 1 for a in aux):
        raise ConfigError(f"aux layer ids {aux}: a DFlash drafter reads layer outputs, HF "
                          f"hidden_states 1..{n - 1} of this {n}-layer verifier (extract with "
                          f"--aux-layers inside that range)")
    ids = target_layer_ids(aux)
    if getattr(options, "dflash_target_layers", "extract") == "spread":
        want = spread_target_layer_ids(n, options.dflash_layers)
        if want != ids:
            from specdraft.core.aux_ids import dflash_target_to_hf_ids

            raise ConfigError(
                f"--dflash-target-layers spread: a {options.dflash_layers}-layer drafter on "
                f"this {n}-layer verifier reads target_layer_ids {want} (z-lab/SpecForge's "
                f"rule), but the run extracted aux ids {aux} (target_layer_ids {ids}); "
                f"extract with --aux-layers "
                f"{','.join(str(i) for i in dflash_target_to_hf_ids(want))}")
    mask_id = options.dflash_mask_token_id if options.dflash_mask_token_id is not None \
        else profile.vocab_size - 1
    config = DFlashConfig.from_profile(
        profile, target_layer_ids=ids, mask_token_id=mask_id,
        block_size=options.dflash_block_size, num_hidden_layers=options.dflash_layers,
        verifier_identity=identity)
    if source.hidden_size != config.target_hidden_size or \
            head["lm_head.weight"].shape[0] != config.vocab_size:
        raise InputError(f"verifier hidden/vocab {config.target_hidden_size}/"
                         f"{config.vocab_size} but source hidden {source.hidden_size}, head "
                         f"of {head['lm_head.weight'].shape[0]} rows")
    torch.manual_seed(options.seed)
    drafter = DFlashDraftModel(config)
    std = getattr(options, "dflash_init_std", None)
    if std is not None:  # after torch's defaults, from the same seeded global generator
        init_normal_(drafter, std)
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(head["embed_tokens.weight"].float())
        drafter.lm_head.weight.copy_(head["lm_head.weight"].float())
    return drafter


def read_export(path: Path, raw: dict[str, Any]
                ) -> tuple[DFlashConfig, dict[str, torch.Tensor], str]:
    """vLLM's native DFlash export read back as vLLM reads it (format ``"dflash"``)."""
    cfg, state = read_dflash(path)
    return cfg, state, "dflash"


def shared_tables() -> tuple[str, ...]:
    """The export holds neither verifier table: vLLM shares both."""
    return ("embed_tokens.weight", "lm_head.weight")


def export_candidate(config: ExportRequest, src: Any, facts: dict[str, Any]) -> Candidate:
    """The export of a DFlash drafter: vLLM's native format only
    (:mod:`specdraft.artifacts.dflash_export`), checked against the same facts as an EAGLE-3
    export (the run's aux ids = ``target_layer_ids + 1``, the verifier's layer count, embedding,
    profile and identity) and read back as vLLM reads it. The frozen tables are never written
    (vLLM shares the verifier's). Raises :class:`ExportRefused` listing every problem."""
    c = src.config
    problems = []
    if config.format != "vllm":
        problems.append(f"--format {config.format}: a DFlash drafter has one engine format, "
                        f"vLLM's native DFlash (--format vllm); SGLang does not load it")
    ids = list(c.aux_layer_ids)
    if facts["extract_ids"] is not None and ids != facts["extract_ids"]:
        problems.append(f"the drafter reads HF hidden_states {ids} (target_layer_ids "
                        f"{list(c.target_layer_ids)} + 1) but the run extracted aux ids "
                        f"{facts['extract_ids']}: it was trained on other layers; retrain it "
                        f"on this run")
    if facts["n_layers"] is not None and facts["n_layers"] != c.target_num_layers:
        problems.append(f"the drafter was built for a {c.target_num_layers}-layer verifier, "
                        f"the verifier has {facts['n_layers']}")
    profile = drafter_profile(c, facts)
    problems += profile_problems(config, profile, facts)
    identity = drafter_identity(src.path, c) or facts["extract_identity"]
    more, binding = identity_problems(config, identity, facts)
    problems += more + embed_problems(config, src.state, facts["embed"])
    head = facts.get("head")
    own = src.state.get("lm_head.weight")
    if own is not None and head is not None and \
            (own.shape != head.shape or not torch.equal(own, head.to(own.dtype))):
        problems.append("the trained state's lm_head.weight is not the verifier's head: the "
                        "drafter was trained to read out with another head than vLLM shares")
    drafter = DFlashDraftModel(c)
    missing, unexpected = drafter.load_state_dict(src.state, strict=False)
    missing = [m for m in missing if not m.startswith(("rotary.", "embed_tokens.", "lm_head."))]
    if missing or unexpected:
        problems.append(f"tensors missing {missing}, unexpected {unexpected}")
    dtype = drafter.fc.weight.dtype if config.dtype == "auto" else getattr(torch, config.dtype)
    tensors = {k: v.detach().to(dtype).cpu().contiguous()
               for k, v in drafter.checkpoint_state().items()}
    cfg = engine_config(c, dtype)
    problems += export_problems(drafter, cfg, tensors)
    if problems:
        raise ExportRefused(problems)
    # layer-output ids: vLLM captures id + 1
    aux = {"dflash_config.target_layer_ids": cfg["dflash_config"]["target_layer_ids"]}
    return Candidate(cfg, tensors, facts, profile, identity, binding, aux)


def engine_format(config: DFlashConfig) -> str:
    """vLLM's native DFlash format, the only one an engine loads."""
    return "vllm"


def doctor(drafter: Any) -> tuple[str, ...]:
    """The doctor's checks a DFlash drafter does not take (reported NOT RUN): it has no draft
    vocabulary (``d2t``/``t2d``: it reads the verifier's head) and none of EAGLE-3's
    computation fields. Every other check runs (tensors, shapes, layer ids, embedding, ...)."""
    return ("check_vocab", "check_computation_fields")


def engine_hints() -> list[str]:
    """The usual causes of an offline/vLLM gap for a DFlash drafter."""
    return ["DFlash drafter: the usual causes are dtype (rerun with --dtype float32) and the "
            "CPU build's rms_norm bug (engine_fixes in results.json says whether it was "
            "worked around)"]


def run_defaults(sections: dict[str, dict[str, Any]], path: Any) -> None:
    """``specdraft run`` with ``train.drafter: dflash``: export in vLLM's DFlash format (the
    only one an engine loads) and eval (and serve) ``k`` = the trained block size - 1, unless
    given; an explicit other format is refused here, before any stage runs."""
    fmt = sections["export"].setdefault("format", "vllm")
    if fmt != "vllm":
        raise ConfigError(f"{path} [export]: format {fmt!r} with train.drafter dflash: a DFlash "
                          f"drafter is exported in vLLM's native format only (format: vllm)")
    block = sections["train"].get("dflash_block_size", DFLASH_BLOCK_SIZE)
    sections["eval"].setdefault("k", block - 1)
