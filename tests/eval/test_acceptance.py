"""Acceptance counting, values by hand."""

from specdraft.eval.acceptance import AcceptanceStats, accepted_prefix, commit_tokens


def test_two_steps_k3_by_hand():
    stats = AcceptanceStats()
    for flags in ([1, 0, 1], [1, 1, 1]):
        n = accepted_prefix(flags)
        stats.add(3, n, n + 1)
    assert [s.accepted for s in stats.steps] == [1, 3]  # the prefix, not the sum of flags
    assert stats.tau == ((1 + 1) + (3 + 1)) / 2 == 3.0
    assert stats.per_position() == [1.0, 0.5, 0.5]
    assert stats.acceptance_rate == 4 / 6


def test_eos_inside_accepted_prefix_stops_there():
    # drafts [5, EOS=2, 7], all three accepted, bonus 9: commit [5, 2] and stop
    tokens, stop = commit_tokens([5, 2, 7], 3, 9, eos_ids=[2])
    assert tokens == [5, 2] and stop
    tokens, stop = commit_tokens([5, 6, 7], 1, 2, eos_ids=[2])  # verifier's own EOS
    assert tokens == [5, 2] and stop
    tokens, stop = commit_tokens([5, 6, 7], 1, 4, eos_ids=[2])
    assert tokens == [5, 4] and not stop
