"""Settings of ``specdraft vocab`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

from pydantic import Field

from specdraft.core.config import StageConfig


class VocabConfig(StageConfig):
    """Settings of the vocab stage: the draft vocabulary size K and which tokens are always
    kept.

    - ``draft_vocab_size``: K, the draft model's output vocabulary (EAGLE-3 used 32,000).
      K >= the verifier's vocabulary gives the full vocabulary.
    - ``verifier_vocab_size``: V; default: recorded by prepare (the verifier's lm_head rows).
    - ``include_byte_fallback``: always keep SentencePiece byte-fallback tokens ``<0x00>``..
      ``<0xFF>`` (so any text stays expressible); the template's special tokens are always kept.
    - ``report_left_out``: how many of the most frequent excluded tokens to report.
    """

    run_dir: str
    draft_vocab_size: int = Field(32000, ge=1)
    verifier_vocab_size: int | None = Field(None, ge=1)
    include_byte_fallback: bool = True
    report_left_out: int = Field(20, ge=0)
    resume: bool = False
    overwrite: bool = False
