"""``specdraft export``: validate, then write ``config.json`` + ``model.safetensors`` for an engine.

Order: read the trained state and the upstream facts (extraction aux ids, verifier embedding and
layer count), build the candidate export in memory, collect every problem
(:mod:`specdraft.artifacts.export`) and refuse when there is any — nothing is written
before that. The output directory is then written atomically (temp dir + rename) and the manifest
last (``RUN/export/manifest.json``, or ``OUT/manifest.json`` without a run directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdraft.artifacts.drafter import read_drafter
from specdraft.artifacts.export import validated_candidate, write_export
from specdraft.artifacts.layout import RunLayout
from specdraft.core.errors import InputError, StageDirError
from specdraft.core.context import StageContext, single_process
from specdraft.core.manifest import (ExportManifest, StageClock, load_stage_manifest, utc_now,
                                     write_manifest, write_provenance)
from specdraft.core.rundir import open_stage_dir
from specdraft import kinds
from specdraft.engines.serve import write_export_card
from specdraft.export.config import ExportConfig
from specdraft.models.eagle3 import AUX_CONVENTION

STAGE = "export"


def source_dir(config: ExportConfig) -> Path:
    """The trained drafter directory: ``--drafter`` or ``RUN/train/best``."""
    if config.drafter is not None:
        return Path(config.drafter)
    return RunLayout(config.run_dir).best


def out_dir(config: ExportConfig) -> Path:
    return Path(config.out) if config.out is not None else \
        RunLayout(config.run_dir).export(config.format)


def run(config: ExportConfig, ctx: StageContext | None = None) -> ExportManifest:
    """Validate and write the export; return its manifest (typed).

    Raises :class:`ExportRefused` listing every problem (nothing written), or
    :class:`StageDirError` when the output exists and ``--overwrite`` was not given.

    ``ctx``: this process (:mod:`specdraft.core.context`), else read from the environment; the
    stage runs in one process (:func:`specdraft.core.context.single_process`).
    """
    clock = StageClock()
    single_process(STAGE, ctx, "cpu")
    src = read_drafter(source_dir(config))
    out = out_dir(config)
    if out.exists() and any(out.iterdir()) and not config.overwrite:
        raise StageDirError(f"{out} exists; pass --overwrite to replace it")
    c = validated_candidate(config, src)
    facts, cfg, tensors = c.facts, c.config, c.tensors
    profile, identity, binding = c.profile, c.identity, c.binding
    manifest_dir, exports = out, {}
    if config.run_dir is not None:
        exports = _earlier_exports(RunLayout(config.run_dir).exports)
        manifest_dir = open_stage_dir(config.run_dir, STAGE, resume=True)
    with write_export(out, c) as tmp:
        write_provenance(tmp, stage=STAGE, config=config, inputs=facts["inputs"],
                         format=config.format, source=str(src.path),
                         verifier_profile=profile.to_dict() if profile is not None else None,
                         verifier_identity=identity, verifier_binding=binding)
    write_export_card(config.run_dir, out, kind=kinds.of(src).name, fmt=config.format,
                      verifier=_verifier_name(config, identity),
                      k=config.speculative_tokens or 3)
    exports[config.format] = {"out": str(out), "config_hash": config.config_hash(),
                              "finished_at": utc_now()}
    return write_manifest(
        manifest_dir, stage=STAGE, config=config, clock=clock, inputs=facts["inputs"],
        counts={"tensors": len(tensors), "parameters": sum(t.numel() for t in tensors.values())},
        extra={"format": config.format, "out": str(out), "exports": exports,
               "source": str(src.path),
               "aux_layer_ids": list(src.config.aux_layer_ids), "aux_convention": AUX_CONVENTION,
               "verifier_profile": profile.to_dict() if profile is not None else None,
               "verifier_identity": identity, "verifier_binding": binding,
               "engine_aux_ids": c.engine_aux_ids,
               "embed_tokens": "verifier copy" if "embed_tokens.weight" in tensors or
               "layers.0.embed_tokens.weight" in tensors else "omitted (engines share the "
               "verifier's)", "checked": "all export checks passed"})


def _verifier_name(config: ExportConfig, identity: dict[str, Any] | None) -> str:
    """The verifier the model card names: ``--verifier``, else the one the drafter's identity
    recorded, else the run's."""
    if config.verifier:
        return config.verifier
    if identity and identity.get("path"):
        return str(identity["path"])
    return "<the verifier the drafter was trained on>"


def _earlier_exports(manifest_dir: Path) -> dict[str, dict[str, Any]]:
    """``{format: {out, config_hash, finished_at}}`` of the run's earlier exports still on disk
    (``RUN/export/manifest.json`` lists every format exported, the newest last)."""
    try:
        earlier = load_stage_manifest(manifest_dir)
    except InputError:
        return {}
    if earlier is None:
        return {}
    known = earlier.exports or {earlier.format: {"out": earlier.out}}
    return {f: e for f, e in known.items() if Path(e["out"]).exists()}
