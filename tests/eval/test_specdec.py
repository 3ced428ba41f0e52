"""The decoding loop pinned down by stand-in drafters, and the rejection sampler's law."""

import torch
from greedy import greedy_reference

from specdraft.eval.specdec import VerifierSession, generate, verify_step


class OracleDrafter:
    """Proposes the verifier's own greedy continuation (full recomputation, no cache); with
    ``wrong`` it proposes that token + 1 (never the verifier's choice)."""

    def __init__(self, model, wrong=False):
        self.model, self.wrong, self.observed = model, wrong, []

    def observe(self, start, feats, tokens):
        self.observed.append((start, len(tokens)))

    @torch.inference_mode()
    def propose(self, context, k, temperature, generator):
        ids = context.clone()
        out = []
        for _ in range(k):
            t = self.model(input_ids=ids[None]).logits[0, -1].argmax()
            out.append(t)
            ids = torch.cat([ids, t.view(1)])
        drafts = torch.stack(out)
        if self.wrong:
            drafts = (drafts + 1) % self.model.config.vocab_size
        return drafts, None


PROMPT = [1, 504, 3458, 314, 253, 1345, 30]


def test_oracle_drafter_gives_tau_k_plus_1(six_layer_verifier):
    m = six_layer_verifier
    d = OracleDrafter(m)
    g = generate(VerifierSession(m, [2, 3, 4]), d, PROMPT, k=3, max_new_tokens=13)
    assert g.stats.tau == 4.0 and g.stats.per_position() == [1.0, 1.0, 1.0]
    assert g.stats.verify_steps == 3  # 1 (prefill) + 3 x 4 = 13 tokens
    assert g.tokens == greedy_reference(m, PROMPT, 13)
    # drafter fed: the prompt pairs, then k+1 new pairs per step, each at the right position
    P = len(PROMPT)
    assert d.observed == [(0, P), (P, 4), (P + 4, 4)]


def test_wrong_drafter_gives_tau_1_and_same_output(six_layer_verifier):
    m = six_layer_verifier
    g = generate(VerifierSession(m, [2, 3, 4]), OracleDrafter(m, wrong=True), PROMPT, k=4,
                 max_new_tokens=6)
    assert g.stats.tau == 1.0 and g.stats.per_position() == [0.0] * 4
    assert g.stats.verify_steps == 5
    assert g.tokens == greedy_reference(m, PROMPT, 6)


def test_verifier_session_aux_are_hf_hidden_states(six_layer_verifier):
    m = six_layer_verifier
    s = VerifierSession(m, [2, 4])
    _, aux1 = s.forward(torch.tensor(PROMPT[:4]))
    _, aux2 = s.forward(torch.tensor(PROMPT[4:]))
    with torch.inference_mode():
        hs = m(input_ids=torch.tensor([PROMPT]), output_hidden_states=True).hidden_states
    want = torch.cat([hs[2][0], hs[4][0]], -1)
    torch.testing.assert_close(torch.cat([aux1, aux2]), want, atol=1e-4, rtol=1e-4)


def test_speculative_sampling_preserves_the_verifier_distribution():
    """First committed token ~ p whatever q (Leviathan et al. 2023, Thm 1), checked empirically."""
    p_logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]]))
    q = torch.tensor([[0.1, 0.1, 0.8]])
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(3)
    n = 5000
    for _ in range(n):
        d = torch.multinomial(q[0], 1, generator=gen)
        acc, vt = verify_step(p_logits, d, q, 1.0, gen)
        counts[int(d[0]) if acc == 1 else vt] += 1
    torch.testing.assert_close(counts / n, torch.tensor([0.5, 0.3, 0.2]), atol=0.03, rtol=0)


def test_greedy_verify_step_by_hand():
    logits = torch.tensor([[0.0, 5, 0], [9, 0, 0], [0, 0, 7], [0, 3, 0]])  # argmax 1, 0, 2, 1
    assert verify_step(logits, torch.tensor([1, 0, 1]), None, 0.0, None) == (2, 2)
    assert verify_step(logits, torch.tensor([1, 0, 2]), None, 0.0, None) == (3, 1)
    assert verify_step(logits, torch.tensor([2, 0, 2]), None, 0.0, None) == (0, 1)
