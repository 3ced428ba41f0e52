"""Stage manifests: ``RUN/<stage>/manifest.json``, written last and atomically.

A stage is complete iff its manifest exists. The manifest records everything needed to trust and
reproduce the output: the resolved config (reloadable as input) and its hash, argv, library
versions, the git revision of specdraft, hashes of the inputs, counts in/out/rejected by reason,
start and end times (UTC ISO-8601) and elapsed seconds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from specdraft.core import lock
from specdraft.core.atomic import atomic_write_json
from specdraft.core.errors import InputError
from specdraft.core.profile import VerifierProfile

MANIFEST = "manifest.json"
_VERSIONED = ("specdraft", "torch", "transformers", "datasets", "safetensors", "httpx", "gguf")


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """sha256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def path_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, or of a directory's files (relative path and content hash of
    each, sorted): the ``inputs`` hash of a user file or ``save_to_disk`` directory."""
    path = Path(path)
    if not path.is_dir():
        return file_sha256(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(path)}:{file_sha256(f)}\n".encode())
    return h.hexdigest()


def manifest_path(stage_dir: str | os.PathLike) -> Path:
    return Path(stage_dir) / MANIFEST


def read_manifest(stage_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The stage's manifest, or None if the stage is not complete.

    Raises :class:`~specdraft.core.errors.InputError` naming the file (and line) when it is not
    UTF-8 JSON or not an object (a manifest is written atomically, so this means it was edited
    or copied badly: rerun the stage with ``--overwrite``).
    """
    from specdraft.core.jsonl import read_json

    path = manifest_path(stage_dir)
    if not path.exists():
        return None
    data = read_json(path, what="stage manifest")
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(data).__name__}; rerun "
                         f"the stage with --overwrite")
    return data


def input_hash(stage_dir: str | os.PathLike) -> str:
    """Hash identifying an upstream stage's output: the sha256 of its manifest file.

    Cheap even for terabytes of shards, and it changes whenever the upstream stage reruns.
    """
    return file_sha256(manifest_path(stage_dir))


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_revision() -> str | None:
    """The git revision of the specdraft source tree, or None when not in a checkout."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return rev.stdout.strip() or None if rev.returncode == 0 else None


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class StageClock:
    """Start time of a stage, taken when the stage begins (for the manifest)."""

    def __init__(self) -> None:
        self.started_at = utc_now()
        self._t0 = time.monotonic()

    def elapsed_s(self) -> float:
        return round(time.monotonic() - self._t0, 3)


def write_manifest(stage_dir: str | os.PathLike, *, stage: str, config: Any, clock: StageClock,
                   inputs: dict[str, str] | None = None, counts: dict[str, Any] | None = None,
                   extra: dict[str, Any] | None = None) -> "Manifest":
    """Write ``stage_dir/manifest.json`` atomically and return it typed (its stage's class,
    :func:`parse_manifest`): what every stage's ``run()`` returns.

    ``config`` is a :class:`~specdraft.core.config.StageConfig`; ``inputs`` maps an input name
    (``"prepare"``, ``"prompts"``) to its hash; ``counts`` holds in/out/rejected-by-reason
    figures; ``extra`` holds stage-specific facts (conventions, token ids, sizes).
    """
    manifest = build_manifest(stage=stage, config=config, clock=clock, inputs=inputs,
                              counts=counts, extra=extra)
    typed = parse_manifest(manifest, manifest_path(stage_dir))  # a stage never writes a
    atomic_write_json(manifest_path(stage_dir), manifest)  # manifest it could not read back
    lock.release(stage_dir)  # the stage is complete: another process may take it now
    return typed


def build_manifest(*, stage: str, config: Any, clock: StageClock,
                   inputs: dict[str, str] | None = None, counts: dict[str, Any] | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The content :func:`write_manifest` writes, as a dict (nothing written): also what a
    stage's other ranks return, the same manifest rank 0 wrote."""
    return {
        "stage": stage,
        "config": config.to_dict(),
        "config_hash": config.config_hash(),
        "argv": list(sys.argv),
        "versions": library_versions(),
        "git_revision": git_revision(),
        "inputs": inputs or {},
        "counts": counts or {},
        "started_at": clock.started_at,
        "finished_at": utc_now(),
        "elapsed_s": clock.elapsed_s(),
        **(extra or {}),
    }


# ---------------------------------------------------------------- typed manifests
# One class per stage: the provenance every manifest carries (:class:`Manifest`) plus, as typed
# fields, the stage facts that other stages, the CLI and the summary read. Further facts a stage
# records stay in the JSON (``extra="allow"``) and are documented in docs/run-dir.md. Every read
# across stages goes through :func:`load_stage_manifest`, so a missing or renamed key is one
# clear error naming the file and the key, never a KeyError deep inside a stage.


class Manifest(BaseModel):
    """Provenance common to every stage's ``manifest.json`` (see :func:`write_manifest`)."""

    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())
    stage: str
    config: dict[str, Any]
    config_hash: str
    argv: list[str] = []
    versions: dict[str, str] = {}
    git_revision: str | None = None
    inputs: dict[str, str] = {}
    counts: dict[str, Any] = {}
    started_at: str
    finished_at: str
    elapsed_s: float

    def figures(self) -> str:
        """One line of the stage's key figures, for the CLI and the run summary."""
        return ""

    def to_dict(self) -> dict[str, Any]:
        """The manifest as its JSON: ``manifest.json``'s content, every extra fact included, no
        default the file did not hold added."""
        return self.model_dump(mode="json", exclude_unset=True)

    # A read-only mapping view of :meth:`to_dict`, so that callers written when ``run()``
    # returned the plain dict (``m["tau"]``, ``m.get("engine")``) read the same values.
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def keys(self) -> Any:
        return self.to_dict().keys()


def _rejects(by_reason: dict[str, int] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (by_reason or {}).items()) or "none"


def _rates(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


class GenerateManifest(Manifest):
    summary: dict[str, Any] = {}

    def figures(self) -> str:
        s, c = self.summary, self.counts
        total, now = c.get("samples", s.get("generated", 0)), s.get("generated", 0)
        return (f"{total} samples{f' ({now} this run)' if now != total else ''}, "
                f"rejected: {_rejects(s.get('rejected'))}, "
                f"errors {s.get('errors', 0)}, with reasoning {s.get('with_reasoning', 0)}, "
                f"{s.get('completion_tokens', 0)} completion tokens "
                f"(mean {s.get('completion_tokens_mean', 0):.0f})")


class ForcedTokenIds(BaseModel):
    """Ids the draft vocabulary always keeps (recorded by prepare, read by vocab)."""

    model_config = ConfigDict(frozen=True)
    eos: list[int] = []
    stop: list[int] = []
    think: list[int] = []
    template_special: list[int] = []
    byte_fallback: list[int] = []


class PrepareManifest(Manifest):
    verifier_vocab_size: int
    tokenizer: dict[str, Any]
    chat_format: dict[str, Any]
    forced_token_ids: ForcedTokenIds
    summary: dict[str, Any] = {}

    def figures(self) -> str:
        s = self.summary
        return (f"{s.get('tokenized', 0)} rows, rejected: "
                f"{_rejects(s.get('rejected_by_reason'))}, {s.get('total_tokens', 0)} tokens, "
                f"{s.get('supervised_tokens', 0)} supervised, {s.get('truncated', 0)} truncated")


class VocabFacts(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    draft_vocab_size: int
    verifier_vocab_size: int
    coverage: float


class VocabManifest(Manifest):
    vocab: VocabFacts

    def figures(self) -> str:
        v = self.vocab
        return (f"K = {v.draft_vocab_size} of V = {v.verifier_vocab_size}, "
                f"coverage {100 * v.coverage:.2f}% of supervised tokens")


class StorageFacts(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    format: str
    bytes_total: int = 0
    bytes_per_token: float = 0.0


class ExtractManifest(Manifest):
    """``aux_layer_ids`` and ``n_layers`` may be absent (an edited manifest): readers that need
    them refuse with how to supply them (export's ``--aux-layers`` / ``--verifier``).
    ``profile``: the verifier's :class:`~specdraft.core.profile.VerifierProfile` (None in
    manifests written before profiles existed). ``verifier_identity``: the verifier's identity
    record (:mod:`specdraft.core.verifier_identity`; None in older manifests)."""

    aux_layer_ids: list[int] = []
    n_layers: int | None = None
    hidden_size: int
    vocab_size: int
    storage: StorageFacts
    verifier: dict[str, Any] = {}
    verify: dict[str, Any] | None = None
    profile: VerifierProfile | None = None
    verifier_identity: dict[str, Any] | None = None

    def figures(self) -> str:
        c, s, v = self.counts, self.storage, self.verify
        return (f"{c.get('rows_out', 0)} rows, {c.get('tokens', 0)} tokens, "
                f"{s.bytes_total / 2**20:.1f} MiB {s.format} "
                f"({s.bytes_per_token:.0f} B/token), aux ids {self.aux_layer_ids}"
                + (f", verify {'ok' if v.get('ok') else 'FAILED'} (max err/bound "
                   f"{v.get('max_err_over_bound', 0):.3g})" if v else ""))


class TrainManifest(Manifest):
    """``world_size``: the processes that trained (every rank returns this manifest; rank 0
    writes it)."""

    steps: int
    world_size: int = 1
    best_step: int | None = None
    best_val: dict[str, Any] | None = None
    tokens_per_s: float = 0.0
    drafter_config: dict[str, Any]
    teacher_check: dict[str, Any] | None = None  # specdraft.artifacts.teacher_check.TeacherReport

    def figures(self) -> str:
        best = self.best_val or {}
        check = self.teacher_check or {}
        teacher = f", teacher check {check['status']}" if check.get("status") else ""
        return (f"{self.steps} steps, best validation τ̂ {best.get('tau', 0):.3f} "
                f"(step {self.best_step}), conditional acc per step "
                f"{_rates(best.get('cond_acc', []))}, {self.tokens_per_s:.0f} tokens/s{teacher}")


class ExportManifest(Manifest):
    format: str
    out: str
    aux_layer_ids: list[int]
    engine_aux_ids: dict[str, Any] = {}
    exports: dict[str, dict[str, Any]] = {}

    def figures(self) -> str:
        return f"{self.format} -> {self.out}\n{'':20}{aux_ids_line(self)}"


#: Where an export's ``config.json`` tells an engine which verifier layers to capture (the keys
#: of ``ExportManifest.engine_aux_ids``, as the kinds write them) -> who reads it, and in which
#: spelling (the conventions: :mod:`specdraft.core.aux_ids`).
ENGINE_AUX_KEYS = {
    "top_level": "vLLM ids",          # eagle_aux_hidden_state_layer_ids: HF ids as they are
    "eagle_config": "SGLang ids",     # eagle_config.eagle_aux_hidden_state_layer_ids
    "dflash_config.target_layer_ids": "vLLM DFlash layer-output ids",  # HF id - 1
}


def aux_ids_line(export: "ExportManifest") -> str:
    """``aux layers: HF hidden_states [2, 15, 27] = vLLM ids [2, 15, 27] = SGLang ids
    [1, 14, 26] (config.json)``: the verifier layers the drafter reads, in specdraft's (HF
    ``hidden_states`` indices) and in each engine's spelling as the export wrote it
    (:data:`ENGINE_AUX_KEYS`; a key no engine reads is named as it is)."""
    parts = [f"aux layers: HF hidden_states {list(export.aux_layer_ids)}"]
    for key, ids in export.engine_aux_ids.items():
        if ids is not None:
            parts.append(f"{ENGINE_AUX_KEYS.get(key, key)} {list(ids)}")
    return " = ".join(parts) + (" (config.json)" if len(parts) > 1 else "")


class EvalManifest(Manifest):
    mode: str = "offline"
    tau: float | None = None
    acceptance_rate: float | None = None
    per_position: list[float] = []
    verify_steps: int | None = None
    tokens_per_s: float | None = None
    engine: dict[str, Any] | None = None
    by_context: dict[str, Any] | None = None
    serve_plan: dict[str, Any] | None = None
    tree: dict[str, Any] | None = None
    sglang_accept_length: float | None = None

    def figures(self) -> str:
        """The offline line (τ by context length when recorded), then the engine's figures
        and the agreement when it ran, then the serve plan's best setting."""
        line = (f"offline τ {self.tau or 0:.3f}, acceptance rate "
                f"{self.acceptance_rate or 0:.3f}, per-position {_rates(self.per_position)}, "
                f"{self.verify_steps or 0} verify steps, {self.tokens_per_s or 0:.1f} tokens/s")
        if self.tree:
            t = self.tree
            line += (f"; SGLang tree {t['steps']}x{t['topk']}x{t['num_draft_tokens']}, accept "
                     f"length {self.sglang_accept_length or 0:.3f}")
        if self.by_context and len(self.by_context) >= 2:  # one bucket: the line above
            line += "; τ by context length " + ", ".join(
                f"{k} {v['tau']:.3f}" for k, v in self.by_context.items())
        if self.serve_plan:
            best = self.serve_plan["settings"][self.serve_plan["best"]]
            line += (f"\n{'':20}serve plan: best {self.serve_plan['best']}, τ "
                     f"{best['tau']:.3f}, predicted speedup {best['predicted_speedup']:.2f}x")
        e = self.engine
        if not e:
            return line
        line += (f"\n{'':20}engine {e.get('version')}: τ {e.get('tau') or 0:.3f}, acceptance "
                 f"rate {e.get('acceptance_rate') or 0:.3f}, per-position "
                 f"{_rates(e.get('per_position') or [])}")
        if e.get("tau_offline_minus_engine") is not None:
            line += (f", offline - engine {e['tau_offline_minus_engine']:+.3f}, identical "
                     f"prompts {e.get('identical_prompts')}")
        for fix in e.get("engine_fixes") or []:  # a patched engine is always said
            line += f"\n{'':20}engine patched by specdraft for this figure: {fix}"
        return line


MANIFEST_TYPES: dict[str, type[Manifest]] = {
    "generate": GenerateManifest, "prepare": PrepareManifest, "vocab": VocabManifest,
    "extract": ExtractManifest, "train": TrainManifest, "export": ExportManifest,
    "eval": EvalManifest,
}


def parse_manifest(data: dict[str, Any] | Manifest, path: str | os.PathLike) -> Manifest:
    """``data`` as its stage's manifest class (a :class:`Manifest` already: itself);
    :class:`InputError` naming ``path`` and the first missing or ill-typed key otherwise."""
    if isinstance(data, Manifest):
        return data
    cls = MANIFEST_TYPES.get(str(data.get("stage")), Manifest)
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        e = err.errors()[0]
        key = ".".join(str(x) for x in e["loc"]) or "(top level)"
        raise InputError(f"{path}: key `{key}`: {e['msg']} ({len(err.errors())} problem(s); "
                         f"written by another specdraft version? re-run that stage)") from None


def load_stage_manifest(stage_dir: str | os.PathLike) -> Manifest | None:
    """The typed manifest of a completed stage, or None when it has not completed.

    Raises :class:`InputError` naming the file when it is not JSON, not an object, or lacks a
    key its stage's class requires.
    """
    data = read_manifest(stage_dir)
    return None if data is None else parse_manifest(data, manifest_path(stage_dir))


PROVENANCE = "provenance.json"


def write_provenance(artifact_dir: str | os.PathLike, *, stage: str, config: Any,
                     inputs: dict[str, str] | None = None, **facts: Any) -> dict[str, Any]:
    """Write ``artifact_dir/provenance.json``: which stage and config made this artifact
    directory (``train/best``, ``train/last``, ``export/<format>``), from which inputs, when,
    with which specdraft revision, plus ``facts`` (e.g. the training step)."""
    record = {"stage": stage, "config_hash": config.config_hash(), "inputs": inputs or {},
              "git_revision": git_revision(), "written_at": utc_now(), **facts}
    atomic_write_json(Path(artifact_dir) / PROVENANCE, record)
    return record
