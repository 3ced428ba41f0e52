"""``specdraft train``: read ``RUN/extract`` (or run the verifier online) and ``RUN/vocab``,
train a drafter of the kind ``--drafter`` names (:mod:`specdraft.kinds`: its builder and
objective), write ``RUN/train``.

Outputs: ``checkpoints/step-N/`` (drafter + ``train_state.pt``), ``best/`` (the drafter with
the highest validation ``τ̂``), ``last/``, ``metrics.jsonl``, ``tb/`` (TensorBoard) and
``manifest.json`` (final and best validation metrics, tokens/s, peak memory).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from specdraft.core.errors import ConfigError, InputError, SpecdraftError
from specdraft.core.manifest import StageClock, TrainManifest, build_manifest, input_hash, \
    parse_manifest, write_manifest
from specdraft.core.profile import VerifierProfile, resolve_profile
from specdraft.core.rundir import check_stage_dir, open_stage_dir, require_stage
from specdraft import kinds
from specdraft.models.eagle3 import AUX_CONVENTION
from specdraft.models.io import Drafter
from specdraft.train.config import TrainConfig
from specdraft.artifacts.batches import Collator
from specdraft.train.data import row_lengths, split_indices
from specdraft.core.context import StageContext, stage_context
from specdraft.train.distributed import barrier, wrap
from specdraft.artifacts.vocab_map import load_vocab_map
from specdraft.train.loop import Data, Trainer, fit
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

    if cfg.endpoint:
        raise ConfigError("--endpoint: the live source is built by `specdraft train` "
                          "(specdraft.cli.train); pass run(..., source=open_live_source)")
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
    contract holds none, or when extract hashed every byte: ``--verifier-fingerprint full``),
    else (online training) read
    from ``--verifier``'s files (:func:`specdraft.core.verifier_identity.identify`); None when
    neither is available."""
    extracted = getattr(extract_manifest, "verifier_identity", None) or {}
    if (extracted.get("weights") or {}).get("scheme") == "full":
        return extracted  # extract --verifier-fingerprint full: the stronger record
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
                  identity: dict[str, Any] | None = None) -> Drafter:
    """A fresh drafter of the kind ``cfg.drafter`` names, shaped from the verifier's profile by
    its home's ``build`` (:mod:`specdraft.kinds.eagle3`, :mod:`specdraft.kinds.dflash`): the
    verifier's tables copied, the profile and the verifier's ``identity`` in its config.

    Raises :class:`InputError` when the source's hidden size or vocab size disagree with the
    verifier's, :class:`ConfigError` for a setting the kind cannot build."""
    return kinds.get(cfg.drafter).hooks().build(cfg, profile, source, head, d2t, t2d, identity)


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
    if cfg.endpoint:  # no verifier in this process; the servers' probe checked its head
        return tc.TeacherReport("skipped", reason="--endpoint: the servers were probed "
                                "(specdraft.extract.endpoint.probe)").to_dict()
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


def _open_train_dir(cfg: TrainConfig, env: StageContext) -> None:
    """``RUN/train`` made ready for writing (emptied under ``--overwrite``) by rank 0, once the
    settings, the data and the teacher have passed their checks (a refused ``--overwrite``
    keeps the drafter it would have replaced)."""
    if env.is_main:
        open_stage_dir(cfg.run_dir, "train", resume=cfg.resume, overwrite=cfg.overwrite)
    barrier(env)


def run(config: TrainConfig, ctx: StageContext | None = None, *, verifier: Any = None,
        source: Any = None) -> TrainManifest:
    """Train a drafter; returns the manifest (typed, on every rank; only rank 0 writes files).

    ``ctx``: this process, from a caller that started the process group itself (else
    :func:`specdraft.core.context.stage_context` reads torchrun's environment and starts it).
    ``verifier``: an already-loaded HF causal LM (online mode, or the head and config source
    when ``source`` is given); ``source``: a ready hidden-state source (tests, ``specdraft
    run``), or a factory ``source(config, ctx)`` called once the process group is up
    (``--endpoint``: :func:`specdraft.extract.live_source.open_live_source`, handed over by
    :mod:`specdraft.cli.train`: a stage does not import another). Runs under torchrun when
    ``WORLD_SIZE > 1``.
    """
    clock = StageClock()
    if ctx is not None:
        return _run(config, ctx, clock, verifier, source)
    with stage_context(config.device) as env:
        return _run(config, env, clock, verifier, source)


def _run(cfg: TrainConfig, env: StageContext, clock: StageClock, verifier: Any, source: Any
         ) -> dict:
    require_stage(cfg.run_dir, "vocab")
    if env.is_main:  # refused now if it would be; RUN/train is emptied once the checks pass
        check_stage_dir(cfg.run_dir, "train", resume=cfg.resume, overwrite=cfg.overwrite)
    out = RunLayout(cfg.run_dir).train
    d2t, t2d = load_vocab_map(cfg.run_dir)
    inputs = {"vocab": input_hash(RunLayout(cfg.run_dir).vocab)}
    factory = callable(source) and not hasattr(source, "get_batch")  # train --endpoint
    if factory:  # it captures into RUN/train/live: the directory is made ready first
        _open_train_dir(cfg, env)
        source = source(cfg, env)
        inputs.update(getattr(source, "inputs", {}))
    if source is None:
        source, verifier, more = open_source(cfg, verifier, env)
        inputs.update(more)
    extract_dir = RunLayout(cfg.run_dir).extract
    from specdraft.core.manifest import load_stage_manifest

    extract_manifest = None if cfg.online else load_stage_manifest(extract_dir)
    profile = verifier_profile(cfg, verifier, extract_manifest)
    head = getattr(source, "head", None) or verifier_head(verifier, cfg.run_dir)
    identity = verifier_identity(cfg, extract_manifest)
    drafter = build_drafter(cfg, profile, source, head, d2t, t2d, identity).to(env.device)
    objective = kinds.resolve(kinds.get(cfg.drafter).objective)(drafter, cfg)
    lengths = row_lengths(source)
    train_idx, val_idx = split_indices(source.keys(), cfg.val_fraction, cfg.seed)
    keep = getattr(objective, "needs_final_hidden", False)  # a full-vocabulary teacher
    probs = getattr(objective, "needs_target_probs", True)  # DFlash reads only the labels
    data = Data(source, Collator(head["lm_head.weight"], d2t, env.device, keep_final_hidden=keep,
                                 cache_argmax=not cfg.online, with_probs=probs),
                train_idx, val_idx, lengths)
    teacher = preflight_teacher(cfg, verifier, data, env)
    if not factory:
        _open_train_dir(cfg, env)
    trainer = Trainer(cfg, env, objective, wrap(objective, env, cfg.parallel), data, out)
    try:
        figures = fit(trainer, resume=cfg.resume)
    finally:
        if hasattr(source, "close"):  # a prefetching source's thread
            source.close()
    report = getattr(objective, "run_report", None)  # an objective's run-level figures
    if report is not None:
        figures.update(report(env))
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
