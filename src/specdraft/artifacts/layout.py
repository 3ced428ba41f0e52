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
        """``RUN/<name>``: the directory stage ``name`` writes (:mod:`specdraft.core.rundir`)."""
        return self.root / name

    @property
    def generate(self) -> Path:
        """``RUN/generate``: the verifier's responses (``specdraft generate``)."""
        return self.stage("generate")

    @property
    def prepare(self) -> Path:
        """``RUN/prepare``: the tokenized rows and the chat format."""
        return self.stage("prepare")

    @property
    def vocab(self) -> Path:
        """``RUN/vocab``: the draft vocabulary map."""
        return self.stage("vocab")

    @property
    def extract(self) -> Path:
        """``RUN/extract``: the verifier's hidden states and head."""
        return self.stage("extract")

    @property
    def train(self) -> Path:
        """``RUN/train``: the drafter's checkpoints (``best``, ``last``)."""
        return self.stage("train")

    @property
    def exports(self) -> Path:
        """``RUN/export``: every export of the run (one folder per format, :meth:`export`)."""
        return self.stage("export")

    @property
    def eval(self) -> Path:
        """``RUN/eval``: acceptance results."""
        return self.stage("eval")

    @property
    def pipeline(self) -> Path:
        """``RUN/run``: ``specdraft run``'s state and summary."""
        return self.stage("run")

    @property
    def verifier_contract(self) -> Path:
        """``RUN/verifier.json``: the verifier, tokenizer and chat format the run is bound to
        (:mod:`specdraft.artifacts.verifier_contract`)."""
        from specdraft.artifacts.verifier_contract import CONTRACT_FILE

        return self.root / CONTRACT_FILE

    @property
    def dataset(self) -> Path:
        """``RUN/prepare/dataset``: the prepared rows (HF ``datasets`` on disk)."""
        return self.prepare / "dataset"

    @property
    def vocab_map(self) -> Path:
        """``RUN/vocab/vocab_map.safetensors`` (:mod:`specdraft.artifacts.vocab_map`)."""
        from specdraft.artifacts.vocab_map import VOCAB_FILE

        return self.vocab / VOCAB_FILE

    @property
    def verifier_head(self) -> Path:
        """``RUN/extract/verifier_head.safetensors`` (:data:`HEAD_FILE`)."""
        return self.extract / HEAD_FILE

    @property
    def best(self) -> Path:
        """``RUN/train/best``: the drafter of the best validation τ̂."""
        return self.train / "best"

    @property
    def last(self) -> Path:
        return self.train / "last"

    def export(self, fmt: str) -> Path:
        """``RUN/export/<fmt>``: the default output of ``specdraft export --format fmt``."""
        return self.exports / fmt

    def is_run(self) -> bool:
        """True when ``root`` holds the manifest of a stage that leaves a drafter or its inputs."""
        return any((self.root / s / MANIFEST).exists() for s in ("train", "export", "extract"))

    def drafter(self, *, prefer_export: bool = True) -> Path:
        """The drafter this run holds: its latest export (``RUN/export/manifest.json`` ``out``)
        when ``prefer_export`` and it still exists, else ``RUN/train/best``.

        Raises :class:`InputError` when the run holds neither."""
        if prefer_export:
            from specdraft.core.manifest import load_stage_manifest

            export = load_stage_manifest(self.exports)
            if export is not None and Path(export.out).exists():
                return Path(export.out)
        if self.best.exists():
            return self.best
        raise InputError(f"{self.root}: a run directory with neither an export nor train/best")
