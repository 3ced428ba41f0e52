"""``specdraft train``: read ``RUN/extract`` (or run the verifier online) and ``RUN/vocab``,
train an EAGLE-3 drafter, write ``RUN/train``.

Outputs: ``checkpoints/step-N/`` (drafter + ``train_state.pt``), ``best/`` (the drafter with
the highest validation ``τ̂``), ``last/``, ``metrics.jsonl``, ``tb/`` (TensorBoard) and
``manifest.json`` (final and best validation metrics, tokens/s, peak memory).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from specdraft.core.aux_ids import hf_to_dflash_target_ids
from specdraft.core.errors import ConfigError, InputError, SpecdraftError
from specdraft.core.manifest import StageClock, TrainManifest, build_manifest, input_hash, \
    parse_manifest, write_manifest
from specdraft.core.profile import VerifierProfile, resolve_profile
from specdraft.core.rundir import open_stage_dir, require_stage
from specdraft.models.eagle3 import AUX_CONVENTION, Eagle3Config, Eagle3DraftModel, \
    default_draft_layer
from specdraft.models.io import drafter_from_dict
from specdraft.train.config import TrainConfig
from specdraft.artifacts.batches import Collator
from specdraft.train.data import row_lengths, split_indices
from specdraft.core.context import StageContext, stage_context
from specdraft.train.distributed import barrier, wrap
from specdraft.artifacts.vocab_map import load_vocab_map
from specdraft.train.loop import Data, Trainer, fit
from specdraft.train.objective import TTTObjective
from specdraft.artifacts.layout import RunLayout
from specdraft.artifacts.verifier_contract import run_verifier

def verifier_profile(cfg: TrainConfig, verifier: Any, extract_manifest: Any) -> VerifierProfile:
    """The verifier profile the drafter is shaped from: the run's
    (:func:`specdraft.artifacts.verifier_contract.run_verifier`: ``RUN/verifier.json``, for a run
    without one RUN/extract's; ``extract_manifest``'s when the contract holds none), else
    (manifests from before profiles) resolved from the
    loaded verifier, or from the config of ``--verifier`` / the extract manifest's
    ``verifier.path``. :class:`ConfigError` when none is available or the config is not
    understood (:func:`specdraft.core.profile.resolve_profile`)."""
    recorded = run_verifier(cfg.run_dir).profile or getattr(extract_manifest, "profile", None)
    if recorded is not None:
        return recorded
    if verifier is not None:
        return resolve_profile(verifier.config, model=verifier)
    recorded = extract_manifest.verifier if extract_manifest is not None else {}
    path = cfg.verifier or recorded.get("path")
    if not path:
        raise ConfigError("--verifier: needed to read the verifier's config (the extract "
                          "manifest records no verifier profile nor path)")
    from specdraft.core.profile import load_hf_config

    return resolve_profile(load_hf_config(path))


def verifier_head(verifier: Any, run_dir: Path) -> dict[str, torch.Tensor]:
    """``{"lm_head.weight": [V, H], "embed_tokens.weight": [V, H]}`` of the verifier:
    ``RUN/extract/verifier_head.safetensors`` when extract wrote one, else the loaded verifier's
    (online training).

    The stored head comes first: it is the embedding export checks the drafter's against, and a
    verifier loaded for this stage may hold other values (``train --dtype bfloat16`` loads it in
    bf16: its embedding rounded, the drafter's frozen copy of it would differ from the verifier's
    and export would refuse the drafter)."""
    from specdraft.artifacts.hidden_states import HEAD_FILE, load_verifier_head

    extract = RunLayout(run_dir).extract
    if verifier is None or (extract / HEAD_FILE).exists():
        return load_verifier_head(extract)
    return {"lm_head.weight": verifier.get_output_embeddings().weight.detach(),
            "embed_tokens.weight": verifier.get_input_embeddings().weight.detach()}


def open_source(cfg: TrainConfig, verifier: Any, env: StageContext) -> tuple[Any, Any, dict]:
    """``(source, verifier, inputs)``: a DiskSource over ``RUN/extract`` or, with ``--online``,
    an OnlineSource running the verifier over ``RUN/prepare/dataset``."""
    from specdraft.artifacts import hidden_states as src

    if not cfg.online:
        require_stage(cfg.run_dir, "extract")
        return src.DiskSource(RunLayout(cfg.run_dir).extract), verifier, \
            {"extract": input_hash(RunLayout(cfg.run_dir).extract)}
    import datasets

    from specdraft.core.verifier import load_verifier
    from specdraft.core.capture import check_aux_ids, default_aux_ids, num_layers

    require_stage(cfg.run_dir, "prepare")
    if env.is_main and cfg.verifier:  # the run's verifier, checked before it is loaded
        from specdraft.artifacts.verifier_contract import bind_model_stage

        bind_model_stage(cfg.run_dir, "train", cfg.verifier, in_memory=verifier is not None)
    if verifier is None:
        verifier = load_verifier(cfg.verifier, dtype=cfg.dtype, device=str(env.device))
    n = num_layers(verifier)
    aux = check_aux_ids(cfg.aux_layers, n) if cfg.aux_layers else default_aux_ids(n)
    dataset = datasets.load_from_disk(str(RunLayout(cfg.run_dir).dataset))
    return src.OnlineSource(verifier, dataset, aux, device=env.device), verifier, \
        {"prepare": input_hash(RunLayout(cfg.run_dir).prepare)}


def verifier_identity(cfg: TrainConfig, extract_manifest: Any) -> dict[str, Any] | None:
    """The identity of the verifier the drafter is trained on: the run's
    (:func:`specdraft.artifacts.verifier_contract.run_verifier`; ``extract_manifest``'s when the
    contract holds none), else (online training) read
    from ``--verifier``'s files (:func:`specdraft.core.verifier_identity.identify`); None when
    neither is available."""
    recorded = run_verifier(cfg.run_dir).identity
    if recorded is not None or extract_manifest is not None:
        return recorded or extract_manifest.verifier_identity
    if not cfg.verifier:
        return None
    from specdraft.core.verifier_identity import identify

    try:
        return identify(cfg.verifier)
    except (ConfigError, OSError, ValueError) as err:
        # a model handed over in memory under a name with no files, or a directory with a
        # config alone (an engine-only verifier): said, and the drafter carries no identity
        print(f"train: verifier identity not recorded ({err})", file=sys.stderr)
        return None


def build_drafter(cfg: TrainConfig, profile: VerifierProfile, source: Any,
                  head: dict[str, torch.Tensor], d2t: torch.Tensor, t2d: torch.Tensor,
                  identity: dict[str, Any] | None = None) -> Eagle3DraftModel:
    """A fresh drafter shaped from the verifier's profile (:meth:`Eagle3Config.from_profile`:
    its shape rules), ``embed_tokens`` copied (frozen), d2t/t2d set; the profile and the verifier's
    ``identity`` travel in the drafter's config (``train/best``, ``train/last``, checkpoints).

    ``--lm-head-init verifier`` (default) starts ``lm_head`` [K, H] at the verifier's rows of the
    draft vocabulary, ``head["lm_head.weight"][arange(K) + d2t]`` (the ids ``d2t`` maps to), so
    the drafter starts from the verifier's own read-out of a final hidden state; the drafter's
    ``norm`` gain stays 1 and learns the verifier's scale. ``verifier-frozen`` also takes
    ``lm_head`` out of the optimizer (speculators 0.9.0 ``_load_verifier_weights`` does that);
    ``random`` keeps ``nn.Linear``'s init. Measured on the quality benchmark (docs/benchmarks.md "Quality").

    Raises :class:`InputError` when the source's hidden size or vocab size disagree."""
    layer = (default_draft_layer(profile.model_type) if cfg.drafter_layer == "auto"
             else cfg.drafter_layer)
    kind = Eagle3Config
    if layer == "mla":  # --drafter-layer mla: the MLA layer (models/eagle3_mla.py)
        from specdraft.models.eagle3_mla import Eagle3MLAConfig as kind
    config = kind.from_profile(
        profile, draft_vocab_size=d2t.numel(), aux_layer_ids=tuple(source.aux_layer_ids),
        attn_impl=cfg.attn_impl, norm_before_residual=cfg.norm_before_residual,
        norm_before_fc=cfg.norm_before_fc, fc_norm=cfg.fc_norm, norm_output=cfg.norm_output,
        draft_layer=layer, verifier_identity=identity)
    if source.hidden_size != config.target_hidden_size or t2d.numel() != config.vocab_size:
        raise InputError(f"verifier hidden/vocab {config.target_hidden_size}/"
                         f"{config.vocab_size} but source hidden {source.hidden_size}, "
                         f"t2d over {t2d.numel()} ids")
    torch.manual_seed(cfg.seed)
    model = drafter_from_dict(config.to_dict())
    with torch.no_grad():
        model.embed_tokens.weight.copy_(head["embed_tokens.weight"].float())
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
        if cfg.lm_head_init != "random":
            target_ids = model.draft_to_target(torch.arange(d2t.numel()))
            model.lm_head.weight.copy_(head["lm_head.weight"][target_ids].float())
    model.lm_head.weight.requires_grad_(cfg.lm_head_init != "verifier-frozen")
    return model


def build_dflash_drafter(cfg: TrainConfig, profile: VerifierProfile, source: Any,
                         head: dict[str, torch.Tensor], identity: dict[str, Any] | None = None
                         ) -> Any:
    """A fresh DFlash drafter (:mod:`specdraft.models.dflash`) shaped from the verifier's
    profile, reading the source's aux layers: HF ``hidden_states`` index ``a`` is layer output
    ``a - 1``, so ``target_layer_ids = aux_layer_ids - 1`` (vLLM adds the 1 back when it serves
    it). The verifier's embedding and head are copied into the frozen tables.

    Raises :class:`ConfigError` when an aux id has no layer-output id (0, the embeddings, or the
    last layer's post-norm state) or the verifier's shape is not one the DFlash layer implements,
    :class:`InputError` when the source's hidden size or vocab differ from the verifier's."""
    from specdraft.models.dflash import DFlashConfig, DFlashDraftModel

    n = profile.n_layers
    aux = list(source.aux_layer_ids)
    if any(a < 1 or a > n - 1 for a in aux):
        raise ConfigError(f"aux layer ids {aux}: a DFlash drafter reads layer outputs, HF "
                          f"hidden_states 1..{n - 1} of this {n}-layer verifier (extract with "
                          f"--aux-layers inside that range)")
    mask_id = cfg.dflash_mask_token_id if cfg.dflash_mask_token_id is not None \
        else profile.vocab_size - 1
    config = DFlashConfig.from_profile(
        profile, target_layer_ids=hf_to_dflash_target_ids(aux), mask_token_id=mask_id,
        block_size=cfg.dflash_block_size, num_hidden_layers=cfg.dflash_layers,
        verifier_identity=identity)
    if source.hidden_size != config.target_hidden_size or \
            head["lm_head.weight"].shape[0] != config.vocab_size:
        raise InputError(f"verifier hidden/vocab {config.target_hidden_size}/"
                         f"{config.vocab_size} but source hidden {source.hidden_size}, head "
                         f"of {head['lm_head.weight'].shape[0]} rows")
    torch.manual_seed(cfg.seed)
    model = DFlashDraftModel(config)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(head["embed_tokens.weight"].float())
        model.lm_head.weight.copy_(head["lm_head.weight"].float())
    return model


def teacher_verifier(cfg: TrainConfig, verifier: Any, extract_manifest: Any, env: StageContext
                     ) -> tuple[Any, str]:
    """``(model, "")`` for the teacher check's fresh forward — the loaded verifier, else
    ``--verifier`` or the extract manifest's ``verifier.path`` loaded in transformers — or
    ``(None, why)`` when none can be loaded (no path; an architecture transformers does not
    run, e.g. a vLLM-only model)."""
    if verifier is not None:
        return verifier, ""
    recorded = extract_manifest.verifier if extract_manifest is not None else {}
    path = cfg.verifier or recorded.get("path")
    if not path:
        return None, "no verifier to compare with (pass --verifier)"
    from specdraft.core.verifier import load_verifier

    try:
        return load_verifier(path, dtype=cfg.dtype, device=str(env.device)), ""
    except (SpecdraftError, OSError, ValueError, KeyError, ImportError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return None, f"the verifier {path} does not load in transformers " \
                     f"({type(err).__name__}: {first[:200]})"


def preflight_teacher(cfg: TrainConfig, verifier: Any, data: Data, env: StageContext) -> dict:
    """The teacher check (:mod:`specdraft.artifacts.teacher_check`) before any step; returns its
    report for the manifest. Raises :class:`InputError` naming the rows when it fails."""
    from specdraft.core.manifest import load_stage_manifest
    from specdraft.artifacts import teacher_check as tc

    if not cfg.teacher_check:
        return tc.TeacherReport("skipped", reason="--no-teacher-check").to_dict()
    extract = load_stage_manifest(RunLayout(cfg.run_dir).extract) if not cfg.online else None
    codec = getattr(data.source, "codec", None)
    storage = extract.storage.format if extract is not None else getattr(codec, "name", "fp32")
    model, why = teacher_verifier(cfg, verifier, extract, env)
    report = tc.check_teacher(data.source, data.collate, model, storage=storage,
                              teacher_rows=cfg.teacher_check_rows, seed=cfg.seed,
                              skip_reason=why)
    if env.is_main:
        print(f"train: {report.line()}", flush=True)
    if report.status == "failed":
        raise InputError(tc.refusal(report, str(RunLayout(cfg.run_dir).extract)))
    return report.to_dict()


def run(config: TrainConfig, ctx: StageContext | None = None, *, verifier: Any = None,
        source: Any = None) -> TrainManifest:
    """Train a drafter; returns the manifest (typed, on every rank; only rank 0 writes files).

    ``ctx``: this process, from a caller that started the process group itself (else
    :func:`specdraft.core.context.stage_context` reads torchrun's environment and starts it).
    ``verifier``: an already-loaded HF causal LM (online mode, or the head and config source
    when ``source`` is given); ``source``: a ready hidden-state source (tests, ``specdraft
    run``). Runs under torchrun when ``WORLD_SIZE > 1``.
    """
    clock = StageClock()
    if ctx is not None:
        return _run(config, ctx, clock, verifier, source)
    with stage_context(config.device) as env:
        return _run(config, env, clock, verifier, source)


def _run(cfg: TrainConfig, env: StageContext, clock: StageClock, verifier: Any, source: Any) -> dict:
    require_stage(cfg.run_dir, "vocab")
    if env.is_main:
        open_stage_dir(cfg.run_dir, "train", resume=cfg.resume, overwrite=cfg.overwrite)
    barrier(env)
    out = RunLayout(cfg.run_dir).train
    d2t, t2d = load_vocab_map(cfg.run_dir)
    inputs = {"vocab": input_hash(RunLayout(cfg.run_dir).vocab)}
    if source is None:
        source, verifier, more = open_source(cfg, verifier, env)
        inputs.update(more)
    extract_dir = RunLayout(cfg.run_dir).extract
    from specdraft.core.manifest import load_stage_manifest

    extract_manifest = None if cfg.online else load_stage_manifest(extract_dir)
    profile = verifier_profile(cfg, verifier, extract_manifest)
    head = verifier_head(verifier, cfg.run_dir)
    identity = verifier_identity(cfg, extract_manifest)
    if cfg.drafter == "dflash":
        from specdraft.train.dflash_objective import DFlashObjective

        drafter = build_dflash_drafter(cfg, profile, source, head, identity).to(env.device)
        objective = DFlashObjective(drafter, anchors=cfg.dflash_anchors, gamma=cfg.gamma(),
                                    seed=cfg.seed)
    else:
        drafter = build_drafter(cfg, profile, source, head, d2t, t2d, identity).to(env.device)
        objective = TTTObjective(drafter, steps=cfg.ttt_steps, step_weight=cfg.step_weight,
                                 loss=cfg.loss, oov_policy=cfg.oov_policy,
                                 align_topk=cfg.align_topk)
    lengths = row_lengths(source)
    train_idx, val_idx = split_indices(source.keys(), cfg.val_fraction, cfg.seed)
    data = Data(source, Collator(head["lm_head.weight"], d2t, env.device), train_idx, val_idx,
                lengths)
    teacher = preflight_teacher(cfg, verifier, data, env)
    trainer = Trainer(cfg, env, objective, wrap(objective, env, cfg.parallel), data, out)
    figures = fit(trainer, resume=cfg.resume)
    counts = {"rows": len(lengths), "rows_train": len(train_idx), "rows_val": len(val_idx),
              "tokens_train": sum(lengths[i] for i in train_idx)}
    extra = {**figures, "world_size": env.world_size, "parallel": cfg.parallel,
             "device": str(env.device), "drafter_config": drafter.config.to_dict(),
             "aux_convention": AUX_CONVENTION, "teacher_check": teacher}
    if env.is_main:
        manifest = write_manifest(out, stage="train", config=cfg, clock=clock, inputs=inputs,
                                  counts=counts, extra=extra)
    else:  # the manifest rank 0 writes, unwritten
        manifest = parse_manifest(build_manifest(stage="train", config=cfg, clock=clock,
                                                 inputs=inputs, counts=counts, extra=extra), out)
    barrier(env)
    return manifest
