"""The prepare summary's figures on a hand-counted tiny input (issue #24, Deliver 3)."""

from __future__ import annotations

from specdraft.prepare.stats import Summary, format_summary


def test_every_figure_on_two_hand_counted_rows():
    s = Summary(vocab_size=10)
    s.samples_in, s.turns_in = 3, 3
    # row 1: 4 tokens, 2 supervised (ids 3, 4), with reasoning
    s.add_row([1, 2, 3, 4], [0, 0, 1, 1], reasoning=True, truncated=False, scaffold=None)
    # row 2: 6 tokens, 3 supervised (ids 6, 7, 8), cut at --max-seq-len; id 12 grows the table
    s.add_row([1, 5, 5, 6, 7, 12], [0, 0, 0, 1, 1, 1], reasoning=False, truncated=True,
              scaffold="think")
    fig = s.figures({"too_long": 1}, elapsed_s=2.0)
    assert fig == {
        "samples_in": 3, "turns_in": 3, "tokenized": 2, "rejected": 1,
        "rejected_by_reason": {"too_long": 1}, "with_reasoning": 1, "with_reasoning_pct": 50.0,
        "truncated": 1, "total_tokens": 10, "supervised_tokens": 5,
        "avg_seq_len": 5.0, "avg_response_len": 2.5,
        "unique_tokens": 8,             # {1, 2, 3, 4, 5, 6, 7, 12}
        "unique_supervised_tokens": 5,  # {3, 4, 6, 7, 12}
        "scaffolds": {"think": 1},
        "elapsed_s": 2.0, "samples_per_s": 1.5, "tokens_per_s": 5.0}
    text = format_summary(fig)
    assert "samples in: 3  turns in: 3  tokenized: 2  rejected (skipped): 1" in text
    assert "with reasoning: 1 (50.0%)  truncated: 1" in text
    assert "tokens: 10  supervised: 5  avg seq len: 5.0  avg response len: 2.5" in text
    assert "unique tokens: 8 (supervised: 5)" in text
    assert "elapsed: 2.0s   1.50 samples/s   5.0 tokens/s" in text
    assert "  rejected too_long: 1" in text
    assert "elapsed_s" not in s.figures({})  # no clock given: no rates
