"""The chunked head + soft cross-entropy (specdraft.train.fused_head) against the plain path:
``-(p * log_softmax(x @ W^T)).sum(-1)`` with autograd, and the whole TTT objective both ways."""

import pytest
import torch
import torch.nn.functional as F

from specdraft.train.fused_head import head_soft_ce
from specdraft.train.objective import TTTObjective

from tests.train.test_objective import (assert_same_unroll, collator, random_row, tiny_drafter,
                                        tiny_mla_drafter, tiny_qwen3_drafter)


def plain(x, weight, probs, w):
    z = (x @ weight.T).float()
    per_col = -(probs * F.log_softmax(z, -1)).sum(-1)
    return (per_col * w).sum(), per_col, z.max(-1).indices


def case(N=37, H=24, K=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, H, generator=g, requires_grad=True)
    weight = torch.randn(K, H, generator=g).mul_(0.3).requires_grad_()
    probs = torch.softmax(torch.randn(N, K, generator=g) * 2, -1)
    probs[3] = 0  # a column with no target mass (as a masked row): loss 0, gradient 0
    w = torch.rand(N, generator=g)
    w[5] = 0  # a column out of the loss
    return x, weight, probs, w


@pytest.mark.parametrize("chunk", [1, 7, 256])
def test_values_and_gradients_equal_the_plain_path(chunk):
    """float32: loss, per-column loss, argmax and the gradients of x and W equal autograd's
    through log_softmax (chunks of 1, 7 (37 = 5 x 7 + 2) and one chunk). Planted (2026-12-06):
    the gradient without the teacher's mass factor, or without the column weight, fails the
    gradient check; the loss without ``* mass`` fails the per-column check at column 3; the
    backward ignoring an upstream gradient other than 1 fails the scaled check."""
    x, weight, probs, w = case()
    ref = plain(x, weight, probs, w)
    ref_grads = torch.autograd.grad(ref[0], (x, weight))
    out = head_soft_ce(x, weight, probs, w, chunk=chunk)
    grads = torch.autograd.grad(out[0], (x, weight))
    torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1], ref[1].detach(), rtol=1e-5, atol=1e-5)
    assert out[1][3] == 0 and torch.equal(out[2], ref[2])
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not grads[0][5].any() and not grads[0][3].any()
    scaled = torch.autograd.grad(-2.5 * head_soft_ce(x, weight, probs, w, chunk=chunk)[0],
                                 (x, weight))  # an upstream gradient other than 1
    for a, b in zip(scaled, ref_grads):
        torch.testing.assert_close(a, -2.5 * b, rtol=1e-5, atol=1e-5)


def test_a_frozen_head_and_no_grad():
    """W without requires_grad: only x's gradient (equal to the plain one); under no_grad the
    same values and nothing kept for a backward."""
    x, weight, probs, w = case(seed=1)
    weight = weight.detach()
    ref = plain(x, weight, probs, w)
    (gx,) = torch.autograd.grad(head_soft_ce(x, weight, probs, w, chunk=8)[0], (x,))
    torch.testing.assert_close(gx, torch.autograd.grad(ref[0], (x,))[0], rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        out = head_soft_ce(x, weight, probs, w)
    assert not out[0].requires_grad
    torch.testing.assert_close(out[0], ref[0].detach(), rtol=1e-5, atol=1e-5)


def test_bf16_autocast_matches_the_autocast_linear():
    """Under bf16 autocast the matmuls run in bf16 as ``nn.Linear``'s would: the same loss and
    argmax as the plain path under the same autocast, and gradients as close to the float32
    ones as the plain path's (W's gradient is summed over chunks in float32, so its rounding
    differs from one bf16 matmul's by a bf16 ulp or so)."""
    x, weight, probs, w = case(N=64, H=32, K=40, seed=2)
    exact = torch.autograd.grad(plain(x, weight, probs, w)[0], (x, weight))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = plain(x, weight, probs, w)
        out = head_soft_ce(x, weight, probs, w, chunk=16)
    ref_grads = torch.autograd.grad(ref[0], (x, weight))
    grads = torch.autograd.grad(out[0], (x, weight))
    assert out[0].dtype == torch.float32 and grads[1].dtype == torch.float32
    torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=1e-4)
    assert torch.equal(out[2], ref[2])
    for a, b, e in zip(grads, ref_grads, exact):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=4e-3)
        assert (a - e).norm() <= 1.1 * (b - e).norm()


def test_shapes_are_checked():
    x, weight, probs, w = case()
    with pytest.raises(ValueError, match="probs"):
        head_soft_ce(x, weight, probs[:, :-1], w)
    with pytest.raises(ValueError, match="must be"):
        head_soft_ce(x[:, :-1], weight, probs, w)


@pytest.mark.parametrize("make, columns", [(tiny_drafter, "live"), (tiny_drafter, "all"),
                                           (tiny_qwen3_drafter, "live"),
                                           (tiny_mla_drafter, "live")])
def test_the_objective_equals_its_plain_head(make, columns):
    """TTTObjective with ``head="fused"`` (the default) against ``"plain"``: the same loss,
    per-step sums, hits and the gradient of every parameter (Llama, Qwen3, MLA layers; 4 TTT
    steps; ``oov_policy="keep"`` and ``"mask"``). Planted (2026-12-06): the fused step's loss
    added without the step weight is caught by the loss and the gradients."""
    g = torch.Generator().manual_seed(5)
    batch = collator()([random_row("a/0", 17, 9, g), random_row("b/0", 12, 4, g),
                        random_row("c/0", 9, 8, g)])
    for oov in ("keep", "mask"):
        results = []
        for head in ("plain", "fused"):
            torch.manual_seed(0)
            obj = TTTObjective(make("split"), steps=4, columns=columns, oov_policy=oov,
                               head=head)
            out = obj(batch, obj.loss_counts(batch))
            params = [p for p in obj.drafter.parameters() if p.requires_grad]
            results.append((out, torch.autograd.grad(out.loss, params)))
        (ref, ref_grads), (out, grads) = results
        assert ref.loss > 0
        assert_same_unroll(out, grads, ref, ref_grads)


def test_the_objective_takes_the_plain_head_where_it_needs_the_logits():
    """align_topk > 1 and the acceptance terms read the logits: with them the fused setting
    gives exactly the plain path's loss (it is the plain path; align_topk 1 needs only the
    argmax, which the fused head gives: ``test_aligned_columns_only_equal_the_masked_unroll``)."""
    g = torch.Generator().manual_seed(6)
    batch = collator()([random_row("a/0", 15, 6, g), random_row("b/0", 11, 3, g)])
    for kw in ({"align_topk": 2}, {"length_weight": 1.0}, {"loss": "hard"}):
        losses = []
        for head in ("plain", "fused"):
            torch.manual_seed(0)
            obj = TTTObjective(tiny_drafter("split"), steps=3, head=head, **kw)
            losses.append(obj(batch, obj.loss_counts(batch)).loss)
        assert torch.equal(losses[0], losses[1]), kw
