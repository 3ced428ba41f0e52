"""The acceptance-targeted terms (train/objective.py: the first-error focal term and the
expected-accepted-length term, docs/drafters.md "Acceptance-targeted terms"): values and
gradients computed by hand on tiny tensors, and both objectives (EAGLE-3's TTT chain, DFlash's
block) adding exactly ``weight * term / norm[0]`` to their loss, against a per-chain loop."""

import math

import pytest
import torch

from specdraft.train.objective import (acceptance_terms, chain_mask, expected_length_term,
                                       first_error_focal_term)

P = torch.tensor([0.5, 0.8, 0.2])  # one chain of 3 steps: p of each step's target


def one_chain(p, valid=None, hit=None):
    """[S, 1] tensors of one chain: logp (requires grad), valid, hit."""
    logp = p.log()[:, None].clone().requires_grad_(True)
    valid = torch.ones(len(p), 1, dtype=torch.bool) if valid is None else \
        torch.tensor(valid)[:, None]
    hit = torch.zeros(len(p), 1, dtype=torch.bool) if hit is None else torch.tensor(hit)[:, None]
    return logp, valid, hit


def test_chain_mask_ends_at_the_first_step_without_target():
    v = torch.tensor([[True, True], [False, True], [True, True]])
    assert chain_mask(v).tolist() == [[True, True], [False, True], [False, True]]


def test_expected_length_by_hand():
    """prod p: 0.5, 0.4, 0.08 -> expected accepted 0.98 of 3 -> term 2.02; d term / d log p_j
    = -sum_{k>=j} prod_{i<=k} p_i = -0.98, -0.48, -0.08."""
    logp, valid, _ = one_chain(P)
    term = expected_length_term(logp, valid)
    assert term.item() == pytest.approx(3 - (0.5 + 0.4 + 0.08), abs=1e-6)
    term.backward()
    assert logp.grad[:, 0].tolist() == pytest.approx([-0.98, -0.48, -0.08], abs=1e-6)


def test_expected_length_stops_at_a_step_without_target():
    """Step 2 has no target: the chain is step 1 alone, 1 - 0.5; step 3's p is not read (a
    -inf there gives no NaN and no gradient)."""
    logp, valid, _ = one_chain(torch.tensor([0.5, 0.8, 0.0]), valid=[True, False, True])
    term = expected_length_term(logp, valid)
    assert term.item() == pytest.approx(0.5, abs=1e-6)
    term.backward()
    assert logp.grad[:, 0].tolist() == pytest.approx([-0.5, 0.0, 0.0], abs=1e-6)


def test_first_error_focal_by_hand():
    """hits [right, wrong, wrong]: the first error is step 2 (p 0.8): (1 - 0.8)^2 * -ln 0.8 =
    0.0089257; gradient there gamma p (1-p)^(gamma-1) ln p - (1-p)^gamma = -0.111406, none at
    steps 1 and 3."""
    logp, valid, hit = one_chain(P, hit=[True, False, False])
    term = first_error_focal_term(logp, hit, valid, gamma=2.0)
    assert term.item() == pytest.approx(0.04 * -math.log(0.8), abs=1e-7)
    term.backward()
    want = 2 * 0.8 * 0.2 * math.log(0.8) - 0.04
    assert logp.grad[:, 0].tolist() == pytest.approx([0.0, want, 0.0], abs=1e-6)


def test_first_error_focal_cases():
    # every step right: no first error, 0
    logp, valid, hit = one_chain(P, hit=[True, True, True])
    assert first_error_focal_term(logp, hit, valid, 2.0).item() == 0.0
    # the first step wrong, gamma 0: the plain cross-entropy of step 1
    logp, valid, hit = one_chain(P, hit=[False, True, False])
    assert first_error_focal_term(logp, hit, valid, 0.0).item() == pytest.approx(math.log(2))
    # a wrong step after the chain ended (no target at step 2) is not a first error
    logp, valid, hit = one_chain(P, valid=[True, False, True], hit=[True, False, False])
    assert first_error_focal_term(logp, hit, valid, 2.0).item() == 0.0


def test_acceptance_terms_weighting_and_batch_shape():
    """Two chains side by side ([S, 2]) = the sum of each alone; weights scale each term."""
    logp = torch.stack([P.log(), torch.tensor([0.9, 0.1, 0.6]).log()], dim=1)
    valid = torch.ones(3, 2, dtype=torch.bool)
    hit = torch.tensor([[True, True], [False, False], [True, True]])
    both = acceptance_terms(logp, hit, valid, focal_weight=0.5, focal_gamma=2.0,
                            length_weight=3.0)
    want = 0.5 * (0.04 * -math.log(0.8) + 0.81 * -math.log(0.1)) + \
        3.0 * ((3 - 0.98) + (3 - (0.9 + 0.09 + 0.054)))
    assert both.item() == pytest.approx(want, abs=1e-5)
    assert acceptance_terms(logp, hit, valid, focal_weight=0.0, focal_gamma=2.0,
                            length_weight=0.0).item() == 0.0


def test_planted_fault_a_detached_product_is_caught():
    """The planted fault of the gradient check: the product detached except at its own step
    (the gradient a per-slot weighting would give) fails the hand-computed gradient."""
    logp, valid, _ = one_chain(P)
    cum = logp.detach().cumsum(0) - logp.detach() + logp  # detached earlier factors
    (1 - cum.exp()).sum().backward()
    assert logp.grad[:, 0].tolist() != pytest.approx([-0.98, -0.48, -0.08], abs=1e-3)


# ----- the objectives add exactly weight * term / norm[0] -----

def chain_reference(logps, valid, hits, *, focal_weight, gamma, length_weight):
    """Per-chain Python loop over lists (independent of the vectorised terms)."""
    total = 0.0
    for lp, v, h in zip(logps, valid, hits):
        prod, first_seen = 1.0, False
        for k in range(len(lp)):
            if not v[k]:
                break
            p = math.exp(lp[k])
            prod *= p
            total += length_weight * (1 - prod)
            if not h[k] and not first_seen:
                total += focal_weight * (1 - p) ** gamma * -lp[k]
                first_seen = True
    return total


def test_eagle3_objective_adds_the_chain_terms():
    """TTTObjective: a column over its 3 TTT steps is a chain; the loss with the terms on minus
    the loss without equals the per-column loop over the same logits, divided by norm[0]."""
    from test_objective import collator, random_row, tiny_drafter
    from specdraft.train.objective import TTTObjective

    g = torch.Generator().manual_seed(3)
    batch = collator()([random_row("a/0", 10, 1, g), random_row("b/0", 8, 2, g)])
    kw = dict(focal_weight=0.7, focal_gamma=2.0, length_weight=0.3)
    base = TTTObjective(tiny_drafter(), steps=3)
    norm = base.loss_counts(batch)
    assert norm[0] != norm[1]  # so a division by another step's count is seen
    plain = base(batch, norm)
    with_terms = TTTObjective(tiny_drafter(), steps=3, **kw)(batch, norm)
    # reference: the same drafter's per-step log p of the label, read through a hook
    seen = []
    drafter = tiny_drafter()
    obj = TTTObjective(drafter, steps=3, length_weight=1e-9)
    orig = obj.chain_step
    obj.chain_step = lambda *a: seen.append(orig(*a)) or seen[-1]
    obj(batch, norm)
    logp = torch.stack([s[0] for s in seen]).detach()  # [S, B, L]
    valid = torch.stack([s[1] for s in seen])
    hits = plain.hits
    chains = [(logp[:, b, t].tolist(), valid[:, b, t].tolist(), hits[:, b, t].tolist())
              for b in range(logp.shape[1]) for t in range(logp.shape[2])]
    ref = chain_reference(*zip(*chains), focal_weight=0.7, gamma=2.0, length_weight=0.3)
    assert ref > 0.1
    assert (with_terms.loss - plain.loss).item() == pytest.approx(ref / norm[0].item(),
                                                                  rel=1e-4)
    assert valid[0].sum() == norm[0]  # every column supervised at step 0 starts a chain


def tiny_dflash(block=4, seed=0):
    from specdraft.models.dflash import DFlashConfig, DFlashDraftModel

    torch.manual_seed(seed)
    c = DFlashConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                     intermediate_size=32, num_hidden_layers=1, rms_norm_eps=1e-6,
                     rope_theta=1e4, max_position_embeddings=64, vocab_size=50,
                     target_hidden_size=16, target_num_layers=4, target_layer_ids=(0, 1),
                     mask_token_id=49, block_size=block)
    return DFlashDraftModel(c)


def dflash_batch(seed=0):
    from specdraft.artifacts.batches import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 49, (2, 9), generator=g)
    sup = torch.zeros(2, 9, dtype=torch.bool)
    sup[0, 2:8], sup[1, 1:6] = True, True  # row 1 padded after position 6
    return TrainBatch(ids, torch.randn(2, 9, 32, generator=g), sup, torch.zeros(11, 4),
                      ids.clone(), 15)


def test_dflash_objective_adds_the_block_terms():
    """DFlashObjective: a block over its mask slots is a chain; loss(terms) - loss(none) equals
    the per-block loop over the drafter's own log p of the targets, divided by norm[0]."""
    from specdraft.train.dflash_objective import IGNORE, DFlashObjective

    kw = dict(anchors=3, gamma=2.0, anchor_draw="distinct")
    plain_obj = DFlashObjective(tiny_dflash(), **kw)
    term_obj = DFlashObjective(tiny_dflash(), focal_weight=0.7, length_weight=0.3, **kw)
    batch, batch2 = dflash_batch(), dflash_batch()
    for o in (plain_obj, term_obj):
        o.train()
    norm = plain_obj.loss_counts(batch)
    assert torch.equal(norm, term_obj.loss_counts(batch2))
    plain, with_terms = plain_obj(batch, norm), term_obj(batch2, norm)
    anchors, block_ids, targets = batch.dflash_blocks
    with torch.no_grad():
        out = plain_obj.drafter(batch.aux_hidden, block_ids, anchors)
        logq = torch.log_softmax(plain_obj.drafter.lm_head(out[:, :, 1:]).float(), -1)
    chains = []
    for b in range(targets.shape[0]):
        for n in range(targets.shape[1]):
            tg = targets[b, n].tolist()
            lp = [logq[b, n, j, t].item() if t != IGNORE else 0.0 for j, t in enumerate(tg)]
            hit = [logq[b, n, j].argmax().item() == t for j, t in enumerate(tg)]
            chains.append((lp, [t != IGNORE for t in tg], hit))
    ref = chain_reference(*zip(*chains), focal_weight=0.7, gamma=2.0, length_weight=0.3)
    assert ref > 0.1
    assert (with_terms.loss - plain.loss).item() == pytest.approx(ref / norm[0].item(),
                                                                  rel=1e-4)
