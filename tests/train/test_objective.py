"""TTT mask, alignment, padding invariance, out-of-vocab policy, soft/hard loss values."""

import pytest
import torch
from torch import nn

from memsource import Row
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel, ttt_mask
from specdraft.artifacts.batches import Collator, TrainBatch, verifier_targets
from specdraft.train.objective import TTTObjective


def test_ttt_mask_T4_3_steps_by_hand():
    want = torch.tensor([
        # step-0 keys  step-1 keys  step-2 keys
        [1, 0, 0, 0,   1, 0, 0, 0,  1, 0, 0, 0],
        [1, 1, 0, 0,   0, 1, 0, 0,  0, 1, 0, 0],
        [1, 1, 1, 0,   0, 0, 1, 0,  0, 0, 1, 0],
        [1, 1, 1, 1,   0, 0, 0, 1,  0, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(ttt_mask(4, 3), want)


class Recorder(nn.Module):
    """A stand-in drafter: records what each TTT step is fed; its logits put all mass on a
    fixed draft id per (step) so hits are known."""

    def __init__(self, K: int) -> None:
        super().__init__()
        self.K, self.seen = K, []
        self.w = nn.Parameter(torch.zeros(()))

    def fuse_aux(self, aux):
        return aux[..., :1] + self.w  # [B, L, 1]: carries the column's feature id

    def ttt_step(self, ids, hidden, pos, history):
        self.seen.append((ids.clone(), pos.clone(), hidden[..., 0].detach().clone()))
        history.append(None)
        return hidden

    def feedback(self, prenorm):
        return prenorm  # EAGLE-3: the next step is fed the prenorm state

    def logits(self, hidden):
        # hidden [..., 1] carries the column t (feature 100 + t); step k fed x_{t+1+k} = t+1+k:
        # predict draft id = the fed token id (mod K) + 1
        k, t = len(self.seen) - 1, (hidden[..., 0].detach() - 100).round().long()
        return torch.nn.functional.one_hot((t + 2 + k) % self.K, self.K).float() * 10 \
            + 0 * hidden[..., :1]


def hand_batch(loss_mask, K=10):
    """x_t = t (token ids 0..T-1), feature of position t = 100 + t, label at p = x_{p+1}."""
    T = len(loss_mask)
    lm = torch.tensor(loss_mask)
    sup = torch.zeros(1, T, dtype=torch.bool)
    sup[0, :-1] = lm[1:] == 1
    label = torch.where(sup, torch.arange(T)[None] + 1, torch.tensor(-1))
    probs = torch.nn.functional.one_hot(label.clamp(min=0), K).float() * sup[..., None]
    aux = (100.0 + torch.arange(T, dtype=torch.float32)).view(1, T, 1)
    return TrainBatch(torch.arange(T)[None], aux, sup, probs[sup], label, T)


def test_alignment_on_hand_made_batch():
    """T=6, loss_mask [0,0,0,1,1,1] (the docstring's worked example), 3 steps."""
    rec = Recorder(10)
    # the stand-in has no ttt_step_live, and only logits() for the head
    obj = TTTObjective(rec, steps=3, columns="all", head="plain")
    out = obj(hand_batch([0, 0, 0, 1, 1, 1]), torch.ones(3))
    for k, (ids, pos, feat) in enumerate(rec.seen):
        assert ids[0].tolist() == [t + 1 + k if t + 1 + k < 6 else 0 for t in range(5)]
        assert pos[0].tolist() == [t + k for t in range(5)]
        assert feat[0].tolist() == [100.0 + t for t in range(5)]  # step k-1's output, same column
    # supervised iff loss_mask[t+2+k] == 1: step 0 -> columns 1,2,3; step 1 -> 0,1,2; step 2 -> 0,1
    assert out.sup[:, 0].int().tolist() == [[0, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]
    # the stand-in predicts fed token + 1 = x_{t+2+k}: every supervised column is a hit
    assert torch.equal(out.hits, out.sup)


class Misser(Recorder):
    """The stand-in with misses planted: at (step, column) in ``wrong`` its argmax is the label
    + 1 (logit 10) and the label only second (logit 5)."""

    def __init__(self, K: int, wrong: set[tuple[int, int]]) -> None:
        super().__init__(K)
        self.wrong = wrong

    def logits(self, hidden):
        k, t = len(self.seen) - 1, (hidden[..., 0].detach() - 100).round().long()
        label = (t + 2 + k) % self.K
        out = torch.nn.functional.one_hot(label, self.K).float() * 10
        for j, col in enumerate(t.tolist()):
            if (k, col) in self.wrong:
                out[j] = 0.0
                out[j, (label[j] + 1) % self.K], out[j, label[j]] = 10.0, 5.0
        return out + 0 * hidden[..., :1]


@pytest.mark.parametrize("align_topk, n_hit, n_miss", [
    # supervised columns: step 0 -> 1..5, step 1 -> 0..4, step 2 -> 0..3 (loss_mask[t+2+k])
    (0, [4, 4, 4], [1, 1, 0]),  # every supervised column
    # top-1: step 0 missed column 2 (and column 0 predicts a prompt token), so step 1 counts
    # {1, 3, 4}; step 1 missed column 1, so step 2 counts {3}
    (1, [4, 2, 1], [1, 1, 0]),
    # top-2: the misses still hold the label second; only column 0 drops out after step 0
    (2, [4, 3, 3], [1, 1, 0]),
])
def test_aligned_columns_by_hand(align_topk, n_hit, n_miss):
    K = 10
    obj = TTTObjective(Misser(K, {(0, 2), (1, 1)}), steps=3, loss="hard",
                        step_weight=1.0, align_topk=align_topk, columns="all")
    out = obj(hand_batch([0, 0, 0, 1, 1, 1, 1, 1], K), torch.ones(3))
    e = torch.exp
    c_hit = torch.log(1 + (K - 1) * e(torch.tensor(-10.0)))
    c_miss = -torch.log(e(torch.tensor(5.0)) / (e(torch.tensor(10.0)) + e(torch.tensor(5.0))
                                                + K - 2))
    want = torch.tensor(n_hit) * c_hit + torch.tensor(n_miss, dtype=torch.float32) * c_miss
    torch.testing.assert_close(out.loss_sum, want)
    torch.testing.assert_close(out.loss, want.sum())
    # the hits (top-1 at every supervised column) are the same whatever the alignment
    assert out.hits[:, 0].int().tolist() == [[0, 1, 0, 1, 1, 1, 0], [1, 0, 1, 1, 1, 0, 0],
                                             [1, 1, 1, 1, 0, 0, 0]]


def tiny_drafter(attn="split") -> Eagle3DraftModel:
    torch.manual_seed(0)
    c = Eagle3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                     intermediate_size=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                     max_position_embeddings=512, vocab_size=40, draft_vocab_size=12,
                     target_hidden_size=16, aux_layer_ids=(1, 2), attn_impl=attn)
    return Eagle3DraftModel(c)


def random_row(key, T, n_sup_from, g):
    mask = torch.zeros(T, dtype=torch.uint8)
    mask[n_sup_from:] = 1
    pos = torch.nonzero(mask[1:] == 1).flatten()
    return Row(key, torch.randint(0, 40, (T,), generator=g), mask,
               torch.randn(T, 32, generator=g), torch.randn(len(pos), 16, generator=g), pos)


def collator(seed=0):
    g = torch.Generator().manual_seed(seed)
    d2t = torch.arange(0, 24, 2)[:12] - torch.arange(12)  # draft ids -> even target ids
    head = torch.randn(40, 16, generator=g) * 3
    head[1::2] *= 0.05  # odd ids (outside the draft vocab) rarely win the argmax
    return Collator(head, d2t, torch.device("cpu"))


def test_padding_does_not_change_the_loss():
    g = torch.Generator().manual_seed(1)
    a = random_row("a/0", 9, 3, g)
    col = collator()
    for attn in ("dense", "split"):
        obj = TTTObjective(tiny_drafter(attn), steps=3)
        small = col([a])
        padded = col([a, random_row("b/0", 14, 14, g)])  # b: longer, no supervised position
        assert padded.input_ids.shape == (2, 14)
        n = obj.loss_counts(small)
        assert n[0] >= 2
        assert torch.equal(n, obj.loss_counts(padded))
        l1, l2 = obj(small, n).loss, obj(padded, n).loss
        torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-6)


def test_collator_targets_and_oov_policy():
    """lm_head = 5 * identity over 6 ids; the draft vocab holds target ids {0, 2, 4}."""
    lm_head = torch.eye(6) * 5
    d2t = torch.tensor([0, 1, 2])  # draft 0,1,2 -> target 0,2,4
    col = Collator(lm_head, d2t, torch.device("cpu"))
    mask = torch.tensor([0, 1, 1, 1], dtype=torch.uint8)
    final = torch.eye(6)[[2, 3, 4]]  # verifier argmax at p=0,1,2: ids 2, 3 (OOV), 4
    row = Row("r/0", torch.tensor([5, 2, 3, 4]), mask, torch.zeros(4, 2), final,
              torch.tensor([0, 1, 2]))
    b = col([row])
    assert b.sup[0].tolist() == [True, True, True, False]
    assert b.label[0].tolist() == [1, -1, 2, -1]
    e5 = torch.exp(torch.tensor(5.0))
    torch.testing.assert_close(b.target_probs[0], torch.stack([1 / (e5 + 2), e5 / (e5 + 2),
                                                               1 / (e5 + 2)]))
    # the OOV position p=1 has the uniform restricted distribution (id 3 is not in the vocab)
    torch.testing.assert_close(b.target_probs[1], torch.full((3,), 1 / 3))
    assert b.target_probs.shape == (3, 3)  # packed: one row per supervised position p=0,1,2
    torch.testing.assert_close(b.dense_probs()[0, 2], b.target_probs[2])
    assert b.dense_probs()[0, 3].sum() == 0
    m = TTTObjective(nn.Identity(), steps=1, oov_policy="mask")
    sup, lab = b.sup[:, 1:], b.label[:, 1:]  # step 0 view: column t <- position t+1
    assert m.loss_mask(sup, lab)[0].tolist() == [False, True, False]  # p=1 OOV dropped
    keep = TTTObjective(nn.Identity(), steps=1, oov_policy="keep")
    assert keep.loss_mask(sup, lab)[0].tolist() == [True, True, False]


def test_collator_argmax_cache_skips_the_full_vocabulary_and_changes_nothing():
    """The hand example above, with ``cache_argmax``: a second epoch gives the same batch bit for
    bit, and reads only the draft rows of the head (the full vocabulary's argmax comes from the
    cache). Planted: poisoning the non-draft rows after the first call changes the labels of a
    collator without the cache (it recomputes the argmax) but not of the cached one."""
    lm_head = torch.eye(6) * 5
    d2t = torch.tensor([0, 1, 2])  # draft 0,1,2 -> target 0,2,4
    mask = torch.tensor([0, 1, 1, 1], dtype=torch.uint8)
    row = Row("r/0", torch.tensor([5, 2, 3, 4]), mask, torch.zeros(4, 2),
              torch.eye(6)[[2, 3, 4]], torch.tensor([0, 1, 2]))
    batches = {}
    for cache in (False, True):
        col = Collator(lm_head.clone(), d2t, torch.device("cpu"), cache_argmax=cache)
        first = col([row])
        assert first.label[0].tolist() == [1, -1, 2, -1]  # the verifier's argmax 2, 3 (OOV), 4
        assert first.verifier_token[0].tolist() == [2, 3, 4, -1]
        col.lm_head[[1, 3, 5]] = torch.eye(6)[[2, 2, 2]] * 100  # id 1, 3, 5 now win at p = 0
        col.lm_head[[1, 3, 5]] += torch.eye(6)[[3, 3, 3]] * 100  # ... and at p = 1
        batches[cache] = first, col([row])
    cached_first, cached_again = batches[True]
    for name in ("input_ids", "sup", "label", "verifier_token", "target_probs"):
        assert torch.equal(getattr(cached_first, name), getattr(cached_again, name)), name
    assert cached_again.verifier_token[0].tolist() == [2, 3, 4, -1]
    assert batches[False][1].verifier_token[0].tolist() != [2, 3, 4, -1]  # the planted change
    torch.testing.assert_close(batches[False][0].target_probs, cached_first.target_probs,
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match="argmax has 2 entries for 3 positions"):
        verifier_targets(torch.eye(6)[[2, 3, 4]], lm_head, torch.tensor([0, 2, 4]),
                         torch.tensor([0, -1, 1, -1, 2, -1]), argmax=torch.tensor([2, 3]))


def test_soft_and_hard_loss_values_by_hand():
    obj = TTTObjective(nn.Identity(), steps=1)
    logits = torch.tensor([[[0.0, 1.0, 2.0]]])
    probs = torch.tensor([[[0.2, 0.3, 0.5]]])
    logq = logits - torch.logsumexp(logits, -1, keepdim=True)
    soft = -(probs * logq).sum()
    torch.testing.assert_close(obj.step_loss(logits, probs, torch.tensor([[2]]))[0, 0], soft)
    hard = TTTObjective(nn.Identity(), steps=1, loss="hard")
    torch.testing.assert_close(hard.step_loss(logits, probs, torch.tensor([[1]]))[0, 0],
                               -logq[0, 0, 1])


def dense_reference(obj, batch, norm):
    """The loss and hits with the head run on EVERY column and masked afterwards (what the
    objective computed before it gathered the supervised columns)."""
    from specdraft.train.objective import shift

    m, (B, T) = obj.drafter, batch.input_ids.shape
    L = T - 1
    cols = torch.arange(L).expand(B, L)
    hidden, history, loss, hits = m.fuse_aux(batch.aux_hidden[:, :L]), [], 0.0, []
    for k in range(obj.steps):
        hidden = m.ttt_step(shift(batch.input_ids, k, L), hidden, cols + k, history)
        logits = m.logits(hidden)  # [B, L, K]
        sup, label = shift(batch.sup, k, L, False), shift(batch.label, k, L, -1)
        logq = torch.log_softmax(logits, -1)
        per_col = -(shift(batch.dense_probs(), k, L) * logq).sum(-1)
        loss = loss + obj.weights[k] / norm[k] * (per_col * obj.loss_mask(sup, label)).sum()
        hits.append((logits.argmax(-1) == label) & sup)
    return loss, torch.stack(hits)


@pytest.mark.parametrize("oov_policy", ["mask", "keep"])
def test_supervised_columns_only_equal_the_dense_masked_loss(oov_policy):
    """Padding, prompt and OOV columns: the gathered head gives the dense reference's loss,
    gradients and hits (float rounding only)."""
    g = torch.Generator().manual_seed(3)
    col = collator()
    batch = col([random_row("a/0", 11, 4, g), random_row("b/0", 7, 2, g)])
    assert (batch.label[batch.sup] < 0).any()  # an OOV label is present
    obj = TTTObjective(tiny_drafter(), steps=3, oov_policy=oov_policy)
    norm = obj.loss_counts(batch)
    out = obj(batch, norm)
    grads = torch.autograd.grad(out.loss, [obj.drafter.lm_head.weight, obj.drafter.fc.weight])
    ref_loss, ref_hits = dense_reference(obj, batch, norm)
    ref_grads = torch.autograd.grad(ref_loss, [obj.drafter.lm_head.weight,
                                               obj.drafter.fc.weight])
    torch.testing.assert_close(out.loss, ref_loss, rtol=1e-6, atol=1e-7)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert torch.equal(out.hits, ref_hits)


def tiny_mla_drafter(attn="split"):
    from specdraft.models.eagle3_mla import Eagle3MLAConfig, Eagle3MLADraftModel

    torch.manual_seed(0)
    c = Eagle3MLAConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                        head_dim=12, intermediate_size=64, rms_norm_eps=1e-6,
                        rope_theta=10000.0, max_position_embeddings=512, vocab_size=40,
                        draft_vocab_size=12, target_hidden_size=16, aux_layer_ids=(1, 2),
                        attn_impl=attn, q_lora_rank=None, kv_lora_rank=8,
                        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    return Eagle3MLADraftModel(c)


def tiny_qwen3_drafter(attn="split"):
    torch.manual_seed(0)
    d = tiny_drafter(attn)
    c = type(d.config).from_dict({**d.config.to_dict(), "draft_layer": "qwen3"})
    return Eagle3DraftModel(c)


def assert_same_unroll(out, grads, ref, ref_grads):
    """Two TTT unrolls of the same drafter and batch agree: loss and per-step sums within float
    rounding, the same hits and supervised columns, every parameter's gradient (>= 12)."""
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.loss_sum, ref.loss_sum, rtol=1e-5, atol=1e-6)
    assert torch.equal(out.hits, ref.hits) and torch.equal(out.sup, ref.sup)
    assert len(grads) >= 12
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("make, attn", [(tiny_drafter, "dense"), (tiny_drafter, "split"),
                                        (tiny_drafter, "fused"), (tiny_qwen3_drafter, "fused"),
                                        (tiny_mla_drafter, "split")])
def test_live_columns_equal_every_column(make, attn):
    """The layer run only at the columns some step supervises (``columns="live"``, the
    default) against every column (``"all"``, ``ttt_step``): the same loss, per-step sums,
    hits and the gradient of every parameter, within float rounding, on rows whose prompts,
    padding and tails leave columns out (Llama, Qwen3 and MLA layers; 4 TTT steps, so a column
    four before the first supervised position is live for its last step only; ``oov_policy
    "keep"`` so that every supervised column is in the loss). Planted (2026-12-06): the live
    set without the last step's columns is caught (loss, gradients)."""
    g = torch.Generator().manual_seed(5)
    batch = collator()([random_row("a/0", 17, 9, g), random_row("b/0", 12, 4, g),
                        random_row("c/0", 9, 8, g)])
    results = []
    for columns in ("all", "live"):
        obj = TTTObjective(make(attn), steps=4, columns=columns, oov_policy="keep")
        norm = obj.loss_counts(batch)
        out = obj(batch, norm)
        params = [p for p in obj.drafter.parameters() if p.requires_grad]
        results.append((out, torch.autograd.grad(out.loss, params)))
    (ref, ref_grads), (out, grads) = results
    from specdraft.train.objective import shift

    L = batch.input_ids.shape[1] - 1
    live = torch.stack([shift(batch.sup, k, L, False) for k in range(4)]).any(0)
    assert 0 < live.sum() < live.numel() - 8  # the live path really leaves columns out
    assert_same_unroll(out, grads, ref, ref_grads)


@pytest.mark.parametrize("make, attn, align_topk, head, warm", [
    (tiny_drafter, "fused", 1, "fused", 30), (tiny_drafter, "split", 1, "plain", 30),
    (tiny_drafter, "fused", 2, "plain", 30), (tiny_mla_drafter, "split", 1, "fused", 30),
    (tiny_drafter, "fused", 1, "fused", 0)])
def test_aligned_columns_only_equal_the_masked_unroll(make, attn, align_topk, head, warm):
    """With ``align_topk`` the live path computes a column's step k only while it is aligned
    (every earlier step's label in that step's top-a): against every column computed and the
    unaligned ones masked (``columns="all"``, the reference), the same loss, per-step sums and
    gradient of every parameter within float rounding, the same ``chain`` and ``reach`` counts
    (so the same τ̂), and hits only where the reference has them (the skipped columns' hits are
    unknown: misses). The drafter is trained 30 steps first so that its columns leave the
    alignment at different steps; untrained, no column is left by the last step (the first
    full-size run raised there). Planted (2026-12-07): the later steps' rows taken unreindexed
    (the first rows of the step before) is caught; so is the alignment's ``[N, a]`` view that
    raised on 0 columns."""
    from specdraft.train.metrics import hit_counts

    g = torch.Generator().manual_seed(5)
    batch = collator()([random_row("a/0", 17, 5, g), random_row("b/0", 12, 2, g),
                        random_row("c/0", 9, 3, g)])
    drafter = make(attn)
    pre = TTTObjective(drafter, steps=4)
    opt = torch.optim.AdamW(drafter.parameters(), lr=3e-2)
    for _ in range(warm):
        opt.zero_grad()
        pre(batch, pre.loss_counts(batch)).loss.backward()
        opt.step()
    results = []
    for columns in ("all", "live"):
        obj = TTTObjective(drafter, steps=4, columns=columns, align_topk=align_topk,
                           head=head if columns == "live" else "plain",
                           oov_policy="keep" if make is tiny_mla_drafter else "mask")
        out = obj(batch, obj.loss_counts(batch))
        params = [p for p in obj.drafter.parameters() if p.requires_grad]
        results.append((out, torch.autograd.grad(out.loss, params)))
    (ref, ref_grads), (out, grads) = results
    counts, ref_counts = hit_counts(out.hits, out.sup), hit_counts(ref.hits, ref.sup)
    # trained: columns leave the alignment at every step, some stay to the last; untrained:
    # none is left at the last step
    assert (ref_counts[2][-1] > 0) == bool(warm) and ref_counts[2][0] < ref_counts[0][0]
    assert counts[1].sum() < ref_counts[1].sum()  # some hits were skipped
    torch.testing.assert_close(counts[2:], ref_counts[2:], rtol=0, atol=0)
    assert torch.equal(out.sup, ref.sup) and not (out.hits & ~ref.hits).any()
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.loss_sum, ref.loss_sum, rtol=1e-4, atol=1e-6)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("make", [tiny_drafter, tiny_mla_drafter])
def test_a_micro_batch_without_live_columns_has_zero_loss_and_zero_gradients(make):
    """Rows with no supervised position (a micro-batch of prompts only): no live column; the
    loss is 0 and every trainable parameter still gets a (zero) gradient, as on the
    every-column path (DDP needs every parameter in the graph). It raised in ``o_proj``'s
    reshape of 0 columns before (found by the online-training engine test)."""
    g = torch.Generator().manual_seed(5)
    batch = collator()([random_row("a/0", 9, 9, g), random_row("b/0", 6, 6, g)])
    assert not batch.sup.any()
    obj = TTTObjective(make("split"), steps=3)
    out = obj(batch, obj.loss_counts(batch))
    params = [p for p in obj.drafter.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.loss, params, allow_unused=True)
    assert out.loss.item() == 0.0 and not out.hits.any()
    assert all(gr is not None and not gr.any() for gr in grads)


def test_collator_without_probs_gives_the_same_labels():
    """``with_probs=False`` (DFlash's objective reads only the labels): [N, 0] probs, the same
    labels and verifier tokens as the full collator, first epoch and cached."""
    g = torch.Generator().manual_seed(3)
    rows = [random_row("a/0", 9, 3, g), random_row("b/0", 12, 5, g)]
    full = collator()(rows)
    base = collator()
    lean = Collator(base.lm_head, base.draft_ids - torch.arange(base.draft_ids.numel()),
                    torch.device("cpu"), cache_argmax=True, with_probs=False)
    for _ in range(2):  # the second call: argmax from the cache
        b = lean(rows)
        assert b.target_probs.shape == (int(full.sup.sum()), 0)
        assert torch.equal(b.label, full.label) and torch.equal(b.verifier_token,
                                                                full.verifier_token)


def test_verifier_targets_of_no_positions_have_the_probs_width():
    """No supervised position: probs [0, K], or [0, 0] without probs (K = 12 here)."""
    col = collator()
    none = torch.zeros(0, 16)
    assert verifier_targets(none, col.lm_head, col.draft_ids, col.t2d_index)[0].shape == (0, 12)
    assert verifier_targets(none, col.lm_head, col.draft_ids, col.t2d_index,
                            with_probs=False)[0].shape == (0, 0)
