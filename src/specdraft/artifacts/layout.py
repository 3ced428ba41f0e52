"""Where every artifact of a run lives: one attribute per path (the format of each file is in
docs/run-dir.md), and the one answer to "which drafter does this run hold?".

Stage ``S`` writes only under ``RUN/S/`` (:mod:`specdraft.core.rundir`); readers ask this
object for a path instead of joining literals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdraft.core.errors import InputError
from specdraft.core.manifest import MANIFEST

#: The verifier's output head and input embedding, stored by extract (``lm_head.weight``,
#: ``embed_tokens.weight``, both [V, H]): the teacher's head and the embedding export checks.
HEAD_FILE = "verifier_head.safetensors"


@dataclass(frozen=True)
class RunLayout:
    """The paths of a run directory ``root`` (``RUN``)."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    def stage(self, name: str) -> Path:
        return self.root / name

    @property
    def verifier_contract(self) -> Path:
        """``RUN/verifier.json``: the verifier, tokenizer and chat format the run is bound to
        (:mod:`specdraft.artifacts.verifier_contract`)."""
        from specdraft.artifacts.verifier_contract import CONTRACT_FILE

        return self.root / CONTRACT_FILE

    @property
    def dataset(self) -> Path:
        """``RUN/prepare/dataset``: the prepared rows (HF ``datasets`` on disk)."""
        return self.root / "prepare" / "dataset"

    @property
    def vocab_map(self) -> Path:
        """``RUN/vocab/vocab_map.safetensors`` (:mod:`specdraft.artifacts.vocab_map`)."""
        from specdraft.artifacts.vocab_map import VOCAB_FILE

        return self.root / "vocab" / VOCAB_FILE

    @property
    def verifier_head(self) -> Path:
        """``RUN/extract/verifier_head.safetensors`` (:data:`HEAD_FILE`)."""
        return self.root / "extract" / HEAD_FILE

    @property
    def best(self) -> Path:
        """``RUN/train/best``: the drafter of the best validation τ̂."""
        return self.root / "train" / "best"

    @property
    def last(self) -> Path:
        return self.root / "train" / "last"

    def export(self, fmt: str) -> Path:
        """``RUN/export/<fmt>``: the default output of ``specdraft export --format fmt``."""
        return self.root / "export" / fmt

    def is_run(self) -> bool:
        """True when ``root`` holds the manifest of a stage that leaves a drafter or its inputs."""
        return any((self.root / s / MANIFEST).exists() for s in ("train", "export", "extract"))

    def drafter(self, *, prefer_export: bool = True) -> Path:
        """The drafter this run holds: its latest export (``RUN/export/manifest.json`` ``out``)
        when ``prefer_export`` and it still exists, else ``RUN/train/best``.

        Raises :class:`InputError` when the run holds neither."""
        if prefer_export:
            from specdraft.core.manifest import load_stage_manifest

            export = load_stage_manifest(self.root / "export")
            if export is not None and Path(export.out).exists():
                return Path(export.out)
        if self.best.exists():
            return self.best
        raise InputError(f"{self.root}: a run directory with neither an export nor train/best")
