"""``specdraft run``: every stage in order, skipping the complete ones, loading the verifier once.

A stage is *complete* when its manifest exists, its config hash equals the one the YAML gives
now, and the upstream manifests it recorded as inputs are the current ones. A complete stage is
skipped; a changed stage reruns from scratch (``overwrite``) along with everything after it; a
stage interrupted by Ctrl-C or a crash (output present, no manifest, same config as when it
started) is continued with ``resume``. An input file edited in place (its content hash differs
from the manifest's) makes its stage stale too. Stages that run the verifier get it through
:class:`SharedVerifier`, loaded once per distinct set of loading settings. The config hash each
stage was started with is kept in
``RUN/run/state.json``; the pipeline's own manifest and summary go to ``RUN/run/``.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any, TextIO

from specdraft.core import lock
from specdraft.core.atomic import atomic_write_json
from specdraft.core.config import StageConfig
from specdraft.core.errors import ConfigError, InputError
from specdraft.core.jsonl import read_json
from specdraft.core.manifest import (MANIFEST, Manifest, StageClock, input_hash, path_sha256,
                                     load_stage_manifest, parse_manifest, read_manifest,
                                     utc_now)
from specdraft.artifacts.layout import RunLayout
from specdraft.core.context import single_process
from specdraft.core.verifier import VerifierSpec
from specdraft.pipeline.config import PipelineConfig
from specdraft.pipeline.stages import STAGE_NAMES, STAGES, StageSpec
from specdraft.pipeline.summary import format_summary

STATE_FILE = "state.json"


def stage_state(run_dir: str, spec: StageSpec, config: StageConfig,
                started: dict[str, str], unused: frozenset[str] = frozenset()) -> str:
    """``"complete"``, ``"partial"`` (resumable), ``"stale"`` (must rerun) or ``"absent"``.

    Complete needs the same config hash, the current upstream manifests and, for the user files
    the stage read (prompts, ``--data``), the same content hash as recorded: a prompt file
    edited in place reruns its stage. ``unused``: stages this run has no use for (their
    ``not_needed``), whose manifests left by an earlier run are not this stage's inputs."""
    path = RunLayout(run_dir).stage(spec.name)
    manifest = read_manifest(path)
    if manifest is not None:
        recorded = manifest.get("inputs", {})
        layout = RunLayout(run_dir)
        fresh = all(input_hash(layout.stage(up)) in set(recorded.values())
                    for up in spec.upstream
                    if up not in unused and (layout.stage(up) / MANIFEST).exists())
        files_same = all(path_sha256(path) == recorded.get(name)
                         for name, path in spec.input_files(config).items())
        same = manifest.get("config_hash") == config.config_hash()
        current = same and fresh and files_same and spec.outdated(config, manifest) is None
        return "complete" if current else "stale"
    if path.exists() and any(path.iterdir()):
        return "partial" if started.get(spec.name) == config.config_hash() else "stale"
    return "absent"


class SharedVerifier:
    """The verifier of the pipeline's stages, loaded on first use with the settings of the stage
    asking (its :class:`~specdraft.core.verifier.VerifierSpec`) and shared by every later stage
    asking with equal settings. A stage asking differently (another ``dtype``, ``device``,
    ``device_map``, ``trust_remote_code`` or path) gets a model loaded its way, the previous one
    released first; no stage's model is ever moved or cast in place for another."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.spec: VerifierSpec | None = None
        self.loads = 0
        self._loaded: tuple[Any, Any] | None = None

    def get(self, spec: VerifierSpec, stage: str) -> tuple[Any, Any]:
        """``(model, tokenizer)`` loaded as ``spec`` says."""
        if self._loaded is not None and spec == self.spec:
            return self._loaded
        if self.spec is not None:
            print(f"[run] {stage}: loading the verifier its own way "
                  f"({'; '.join(self.spec.differences(spec))})", file=self.stream)
        self._loaded = None
        gc.collect()
        self._loaded, self.spec = spec.load(), spec
        self.loads += 1
        return self._loaded


def select_stages(from_stage: str | None, until: str | None) -> list[StageSpec]:
    """The stages ``--from``/``--until`` bound, in order; ConfigError on a bad name or order."""
    for flag, name in (("--from", from_stage), ("--until", until)):
        if name is not None and name not in STAGE_NAMES:
            raise ConfigError(f"{flag} {name}: not a stage; stages are {list(STAGE_NAMES)}")
    lo = STAGE_NAMES.index(from_stage) if from_stage else 0
    hi = STAGE_NAMES.index(until) if until else len(STAGES) - 1
    if lo > hi:
        raise ConfigError(f"--from {from_stage} comes after --until {until}")
    return list(STAGES[lo: hi + 1])


def run(config: PipelineConfig, *, from_stage: str | None = None, until: str | None = None,
        stream: TextIO | None = None) -> dict[str, Any]:
    """Run the selected stages in order; return the pipeline manifest (with per-stage actions).

    ``from_stage``/``until`` bound the stages considered; stages before ``from_stage`` are
    neither run nor checked (e.g. ``--from prepare`` with ``prepare.data`` set needs no
    generation). Inside the bounds the usual rules apply: skip complete, resume partial, rerun
    changed. Raises whatever a stage raises; a ``KeyboardInterrupt`` leaves every stage
    resumable.
    """
    stream = stream or sys.stderr
    clock = StageClock()
    run_dir = config.run_dir
    lock.acquire(RunLayout(run_dir).pipeline, what="specdraft run")
    state_path = RunLayout(run_dir).pipeline / STATE_FILE
    started = read_json(state_path, what="pipeline state") if state_path.exists() else {}
    if not isinstance(started, dict):
        raise InputError(f"{state_path}: expected a JSON object; delete it to rerun every stage")
    verifier = SharedVerifier(stream)
    actions: dict[str, str] = {}
    upstream_ran = False
    unused = {s.name: why for s in STAGES if (why := s.not_needed(config.stages))}
    for spec in select_stages(from_stage, until):
        cfg = config.stages[spec.name]
        if spec.name in unused:
            actions[spec.name] = f"not needed ({unused[spec.name]})"
            print(f"[run] {spec.name}: not needed, {unused[spec.name]}", file=stream)
            continue
        state = stage_state(run_dir, spec, cfg, started, frozenset(unused))
        if state == "complete" and not upstream_ran:
            actions[spec.name] = "skipped (complete)"
            print(f"[run] {spec.name}: complete, skipped", file=stream)
            continue
        resume = state == "partial" and not upstream_ran
        action = "resumed" if resume else "ran"
        print(f"[run] {spec.name}: {'resuming' if resume else 'running'} ({state})", file=stream)
        started[spec.name] = cfg.config_hash()
        atomic_write_json(state_path, started)
        manifest = parse_manifest(_run_stage(spec, cfg, resume=resume, verifier=verifier),
                                  spec.name)
        print(f"[run] {spec.name}: done in {manifest.elapsed_s:.0f}s — {manifest.figures()}",
              file=stream)
        actions[spec.name] = action
        upstream_ran = True
    return _finish(config, actions, clock, stream)


def _run_stage(spec: StageSpec, cfg: StageConfig, *, resume: bool,
               verifier: SharedVerifier) -> Manifest:
    control = {"resume": resume, "overwrite": not resume}
    cfg = cfg.model_copy(update={k: v for k, v in control.items() if k in type(cfg).model_fields})
    kwargs = spec.entry_kwargs(cfg)
    if spec.uses_verifier(cfg):
        model, tokenizer = verifier.get(VerifierSpec.of(cfg), spec.name)
        kwargs["verifier"] = (model, tokenizer) if spec.verifier_arg == "pair" else model
    device = getattr(cfg, "device", None)
    ctx = single_process("specdraft run", None, None if device == "auto" else device)
    return spec.load_entry()(cfg, ctx, **kwargs)


def _finish(config: PipelineConfig, actions: dict[str, str], clock: StageClock,
            stream: TextIO) -> dict[str, Any]:
    manifests = {name: load_stage_manifest(RunLayout(config.run_dir).stage(name))
                 for name in STAGE_NAMES}
    summary = format_summary(config, manifests, total_s=clock.elapsed_s())
    print(summary, file=stream)
    out = RunLayout(config.run_dir).pipeline
    (out / "summary.txt").write_text(summary + "\n", encoding="utf-8")
    manifest = {"stage": "run", "config_file": config.source, "run_dir": config.run_dir,
                "actions": actions, "argv": list(sys.argv), "started_at": clock.started_at,
                "finished_at": utc_now(), "elapsed_s": clock.elapsed_s(),
                "stage_elapsed_s": {n: m.elapsed_s if m else None for n, m in manifests.items()},
                "stage_configs": {n: c.to_dict() for n, c in config.stages.items()}}
    atomic_write_json(Path(out) / MANIFEST, manifest)
    lock.release(out)
    return manifest
