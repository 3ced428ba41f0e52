"""Settings of ``specdraft vocab`` (field names = CLI flags with ``_``)."""

from __future__ import annotations

from pydantic import Field

from specdraft.core.config import StageConfig


class VocabConfig(StageConfig):
    """Settings of the vocab stage: the draft vocabulary size K and which tokens are always
    kept (the template's special tokens always are).
    """

    run_dir: str = Field(description="Run directory; reads RUN/prepare/, writes RUN/vocab/.")
    draft_vocab_size: int = Field(32000, ge=1, description="K, the drafter's output vocabulary "
                                                           "(EAGLE-3 used 32000); K >= V gives "
                                                           "the full vocabulary.")
    verifier_vocab_size: int | None = Field(None, ge=1, description="V, the verifier's lm_head "
                                                                    "rows (none: as recorded by "
                                                                    "prepare).")
    include_byte_fallback: bool = Field(True, description="Always keep the SentencePiece "
                                                          "byte-fallback tokens <0x00>..<0xFF> "
                                                          "(any text stays expressible).")
    report_left_out: int = Field(20, ge=0, description="How many of the most frequent excluded "
                                                       "tokens to report.")
    resume: bool = Field(False, description="Run again over RUN/vocab.")
    overwrite: bool = Field(False, description="Delete RUN/vocab and start over.")
