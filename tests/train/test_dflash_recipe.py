"""DFlash's recipe settings (docs/drafters.md "DFlash recipe settings"): distinct anchors where
vLLM anchors, the same per row whatever the micro-batch; D-PACE weights by hand; the verifier's
argmax and soft labels; the label counter; z-lab/SpecForge's target-layer rule; N(0, 0.02)
initialisation; and a training run with every new setting on."""

import json

import pytest
import torch

from specdraft.artifacts.batches import TrainBatch
from specdraft.train.dflash_objective import (IGNORE, DFlashObjective, dpace_weights,
                                              draw_distinct, vllm_anchorable)
from test_acceptance_terms import tiny_dflash


def rows_batch(rows):
    """A right-padded TrainBatch of ``rows`` [(ids [T], loss_mask [T])] (teacher: the row)."""
    B, T = len(rows), max(len(r[0]) for r in rows)
    ids = torch.zeros(B, T, dtype=torch.long)
    sup = torch.zeros(B, T, dtype=torch.bool)
    for b, (x, m) in enumerate(rows):
        ids[b, :len(x)] = x
        sup[b, :len(x) - 1] = m[1:] == 1
    g = torch.Generator().manual_seed(B)
    top = torch.where(sup, torch.roll(ids, -1, 1), torch.full_like(ids, -1))
    return TrainBatch(ids, torch.randn(B, T, 32, generator=g), sup,
                      torch.zeros(int(sup.sum()), 4), ids.clone(), B * T, top)


def four_rows():
    g = torch.Generator().manual_seed(7)
    out = []
    for T, prompt, turn2 in ((30, 5, None), (22, 9, None), (40, 3, (20, 26)), (12, 8, None)):
        m = torch.zeros(T, dtype=torch.long)
        m[prompt:] = 1
        if turn2:  # a second user turn inside the conversation: not generated
            m[turn2[0]:turn2[1]] = 0
        out.append((torch.randint(0, 49, (T,), generator=g), m))
    return out


def test_vllm_anchorable_by_hand():
    """loss_mask [0,0,1,1,1,0,1,1]: anchors where x_a is generated and x_{a+1} supervised:
    2, 3, 6 (not 1, the last prompt token; not 4, whose next token is a user's; not 7, the
    last)."""
    m = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1])
    assert torch.nonzero(vllm_anchorable(m)).flatten().tolist() == [2, 3, 6]


def test_distinct_anchors_same_for_micro_batch_1_and_4_all_valid():
    rows = four_rows()
    obj = DFlashObjective(tiny_dflash(), anchors=8, gamma=2.0, anchor_draw="distinct", seed=3)
    obj.train()
    obj.step = 5
    whole = obj.blocks(rows_batch(rows))[0]
    for b, (x, m) in enumerate(rows):
        alone = obj.blocks(rows_batch([(x, m)]))[0][0]
        cand = torch.nonzero(vllm_anchorable(m)).flatten().tolist()
        n = min(8, len(cand))
        got = whole[b, :n].tolist()
        assert got == alone.tolist()  # the same anchors in a micro-batch of 1 and of 4
        assert len(set(got)) == n == len(got)  # distinct, as many as asked or available
        for a in got:  # all where vLLM anchors: x_a generated, x_{a+1} supervised
            assert m[a] == 1 and m[a + 1] == 1
    # the 12-token row has 3 anchorable positions: fewer blocks, padded without targets
    assert len(torch.nonzero(vllm_anchorable(rows[3][1]))) == 3
    assert (obj.blocks(rows_batch(rows))[2][3, 3:] == IGNORE).all()
    # another step draws other anchors (the draw is seeded by the step)
    obj.step = 6
    assert not torch.equal(obj.blocks(rows_batch(rows))[0], whole)


def test_planted_fault_supervised_positions_are_not_vllm_anchors():
    """The planted fault: drawing distinct anchors among the supervised positions (the
    replacement draw's set) anchors at the last prompt token, which vLLM never does."""
    from specdraft.core.conventions import supervised_mask

    m = four_rows()[0][1]
    g = torch.Generator().manual_seed(0)
    wrong = draw_distinct(supervised_mask(m), 64, g).tolist()
    assert any(m[a] == 0 for a in wrong)  # position 4, the prompt's last token


def test_replacement_draw_is_unchanged():
    """The default draw: 32 anchors per row with replacement among the supervised positions."""
    rows = four_rows()
    obj = DFlashObjective(tiny_dflash(), anchors=32, gamma=2.0)
    obj.train()
    anchors = obj.blocks(rows_batch(rows))[0]
    assert anchors.shape == (4, 32)
    sup = rows_batch(rows).sup
    assert all(sup[b, a] for b in range(4) for a in anchors[b].tolist())


def test_dpace_weights_by_hand():
    """p = 0.5, 0.8, 0.2, alpha 0.5: s = 0.75, 0.9, 0.6; prefix 0.75, 0.675, 0.405; suffix sums
    1.83, 1.08, 0.405. Slot 2 without target: s_2 = 1, w_2 = 0, prefix 0.75, 0.75, 0.45."""
    p = torch.tensor([[0.5, 0.8, 0.2]])
    w = dpace_weights(p, torch.ones(1, 3, dtype=torch.bool), 0.5)
    assert w[0].tolist() == pytest.approx([1.83, 1.08, 0.405], abs=1e-6)
    w = dpace_weights(p, torch.tensor([[True, False, True]]), 0.5)
    assert w[0].tolist() == pytest.approx([1.2, 0.0, 0.45], abs=1e-6)
    # alpha 1: the number of supervised slots from k on
    assert dpace_weights(p, torch.ones(1, 3, dtype=torch.bool), 1.0)[0].tolist() == [3, 2, 1]


def test_dpace_is_the_expected_length_gradient_at_alpha_0():
    """At alpha 0, D-PACE's weight is minus the gradient of the expected-length term by log p
    (docs/drafters.md): two definitions, one number."""
    from specdraft.train.objective import expected_length_term

    p = torch.tensor([0.5, 0.8, 0.2])
    logp = p.log()[:, None].clone().requires_grad_(True)
    expected_length_term(logp, torch.ones(3, 1, dtype=torch.bool)).backward()
    w = dpace_weights(p[None], torch.ones(1, 3, dtype=torch.bool), 1e-12)[0]
    torch.testing.assert_close(w, -logp.grad[:, 0])


def test_dpace_objective_weights_each_block_by_its_own_confidence():
    """The objective's D-PACE loss equals sum over slots of w * CE / norm_k, w from each block's
    own detached p (recomputed here from the drafter's logits)."""
    rows = four_rows()[:2]
    obj = DFlashObjective(tiny_dflash(), anchors=4, gamma=2.0, weights="dpace",
                          dpace_alpha=0.5, anchor_draw="distinct")
    obj.train()
    batch = rows_batch(rows)
    norm = obj.loss_counts(batch)
    loss = obj(batch, norm).loss
    anchors, block_ids, targets = batch.dflash_blocks
    with torch.no_grad():
        out = obj.drafter(batch.aux_hidden, block_ids, anchors)
        logq = torch.log_softmax(obj.drafter.lm_head(out[:, :, 1:]).float(), -1)
    valid = targets != IGNORE
    lp = logq.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    w = dpace_weights(lp.exp(), valid, 0.5)
    want = sum((w[..., k] * -lp[..., k] * valid[..., k]).sum() / norm[k] for k in range(3))
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert obj.weights == [1.0, 1.0, 1.0]  # the logged loss: the plain sum of slot CEs


def test_verifier_labels_and_counter():
    """labels=verifier trains slot j of anchor a on the verifier's argmax at a + j - 1; with
    one planted disagreement the counter sees it, and the slot's target follows the verifier."""
    x, m = four_rows()[0]
    batch = rows_batch([(x, m)])
    batch.verifier_token[0, 10] = 48  # the verifier would say 48 where the row has x[11]
    obj = DFlashObjective(tiny_dflash(), anchors=30, gamma=2.0, anchor_draw="distinct",
                          labels="verifier")
    obj.train()
    anchors, _, targets = obj.blocks(batch)
    hard = obj.hard_targets(batch, anchors, targets)
    for n, a in enumerate(anchors[0].tolist()):
        for j in range(3):
            if targets[0, n, j] != IGNORE:
                want = 48 if a + j == 10 else x[a + j + 1].item()
                assert hard[0, n, j].item() == want
    assert (hard == 48).any()
    sup = int(batch.sup.sum())
    assert obj.label_counts.tolist() == [1.0, float(sup)]
    row = DFlashObjective(tiny_dflash(), anchors=30, gamma=2.0, anchor_draw="distinct")
    assert torch.equal(row.hard_targets(batch, anchors, targets), targets)


def test_soft_labels_are_the_verifier_distribution():
    """labels=soft: the slot's target is softmax(final_hidden @ lm_head.T) at a + j - 1, and
    its loss is the soft cross-entropy; a teacher one-hot on the row's token (a very large
    logit) gives the hard loss."""
    x, m = four_rows()[1]
    batch = rows_batch([(x, m)])
    obj = DFlashObjective(tiny_dflash(), anchors=6, gamma=2.0, anchor_draw="distinct",
                          labels="soft")
    assert obj.needs_final_hidden
    head = obj.drafter.lm_head.weight  # [V, H]: final = 100 * unit row of the token's head
    nxt = torch.roll(batch.input_ids, -1, 1)[batch.sup]
    batch.final_hidden = 1e3 * head[nxt] / head[nxt].norm(dim=-1, keepdim=True) ** 2
    obj.train()
    norm = obj.loss_counts(batch)
    soft = obj(batch, norm)
    hard_obj = DFlashObjective(tiny_dflash(), anchors=6, gamma=2.0, anchor_draw="distinct")
    hard_obj.train()
    hard = hard_obj(rows_batch([(x, m)]), norm)
    assert soft.loss.item() == pytest.approx(hard.loss.item(), rel=1e-4)
    anchors = batch.dflash_blocks[0]
    b, n, j = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), \
        torch.ones(1, dtype=torch.long)
    probs = obj.teacher_probs(batch, b, n, j, anchors)
    assert probs.argmax().item() == x[anchors[0, 0] + 2].item()  # slot 2 predicts x_{a+2}
    del batch.final_hidden
    batch.final_hidden = None
    with pytest.raises(ValueError, match="dflash-labels soft"):
        obj.teacher_probs(batch, b, n, j, anchors)


def test_spread_target_layer_ids():
    from specdraft.models.dflash import spread_target_layer_ids

    assert spread_target_layer_ids(30, 2) == [1, 27]  # the example
    assert spread_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-4B, 5 draft layers
    assert spread_target_layer_ids(30, 1) == [15]
    assert spread_target_layer_ids(28, 3) == [1, 13, 25]


def test_spread_rule_refuses_other_extracted_layers(run_dir, verifier, source):
    from specdraft.core.errors import ConfigError
    from specdraft.train.config import TrainConfig
    from specdraft.train.run import run

    cfg = TrainConfig(run_dir=run_dir, drafter="dflash", dflash_layers=1,
                      dflash_target_layers="spread", max_steps=1)
    # the tiny verifier has 4 layers: a 1-layer drafter reads [4 // 2] = [2], HF id 3; the
    # run extracted aux ids (1, 2, 3)
    with pytest.raises(ConfigError, match=r"reads target_layer_ids \[2\].*--aux-layers 3$"):
        run(cfg, verifier=verifier, source=source)


def test_init_normal():
    from specdraft.models.dflash import init_normal_

    model = tiny_dflash()
    embed, head = model.embed_tokens.weight.clone(), model.lm_head.weight.clone()
    init_normal_(model, 0.02, torch.Generator().manual_seed(0))
    w = torch.cat([p.flatten() for n, p in model.named_parameters()
                   if n.endswith("proj.weight") or n == "fc.weight"])
    assert abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.002
    assert torch.equal(model.embed_tokens.weight, embed)  # the verifier's tables untouched
    assert torch.equal(model.lm_head.weight, head)
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))


def test_dflash_options_are_dflash_only_and_terms_shared(tmp_path):
    from pydantic import ValidationError

    from specdraft.train.config import TrainConfig

    with pytest.raises(ValidationError, match="--dflash-labels"):
        TrainConfig(run_dir=tmp_path, dflash_labels="soft")
    TrainConfig(run_dir=tmp_path, loss_focal_weight=0.5, loss_expected_length_weight=0.1)
    TrainConfig(run_dir=tmp_path, drafter="dflash", loss_focal_weight=0.5)
    # a knob of a setting that is off is refused, not ignored
    with pytest.raises(ValidationError, match="--loss-focal-gamma is read only with"):
        TrainConfig(run_dir=tmp_path, loss_focal_gamma=1.0)
    with pytest.raises(ValidationError, match="--dflash-dpace-alpha is read only with"):
        TrainConfig(run_dir=tmp_path, drafter="dflash", dflash_weights="exp",
                    dflash_dpace_alpha=0.3)
    with pytest.raises(ValidationError, match="--dflash-gamma is read only with "
                                              "--dflash-weights exp"):
        TrainConfig(run_dir=tmp_path, drafter="dflash", dflash_gamma=3.0)  # D-PACE: no gamma
    TrainConfig(run_dir=tmp_path, drafter="dflash", dflash_weights="exp", dflash_gamma=3.0)
    # D-PACE is the default (docs/benchmarks.md "DFlash ablation", 2026-12-05)
    assert TrainConfig(run_dir=tmp_path, drafter="dflash").dflash_weights == "dpace"
    TrainConfig(run_dir=tmp_path, drafter="dflash", dflash_dpace_alpha=0.3,
                loss_focal_weight=1.0, loss_focal_gamma=0.0)


def test_training_with_every_new_setting(run_dir, verifier, source):
    """All new settings at once train (loss falls), and the manifest has the label counter: 0
    on the verifier's own greedy answers."""
    from specdraft.train.config import TrainConfig
    from specdraft.train.run import run

    cfg = TrainConfig(run_dir=run_dir, epochs=1000, max_steps=30, lr=3e-3, warmup_steps=5,
                      batch_tokens=36 * 4, val_fraction=0.2, eval_every=30, save_every=30,
                      log_every=10, drafter="dflash", dflash_block_size=4, dflash_anchors=8,
                      dflash_anchor_draw="distinct", dflash_weights="dpace",
                      dflash_labels="soft", dflash_init_std=0.02, loss_focal_weight=0.5,
                      loss_expected_length_weight=0.5)
    m = run(cfg, verifier=verifier, source=source)
    recs = [json.loads(line) for line in
            (run_dir / "train" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["split"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"]
    counter = m.to_dict()["verifier_argmax_differs"]
    assert counter["positions"] > 100 and counter["differ"] == 0
