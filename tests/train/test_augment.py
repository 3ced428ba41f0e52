"""The training-only noise on the aux hidden states (``--hidden-noise``): its value by hand,
its independence from batching, and that the loop applies it to training steps only."""

import math

import pytest
import torch

from specdraft.train.augment import noised_aux_hidden, row_generator


def test_value_by_hand():
    """Two aux layers of H = 2: layer 0 holds (3, 4) (rms sqrt(12.5)), layer 1 (0, 2) (rms
    sqrt(2)); the noise is sigma * rms * eps with eps the row generator's first draws."""
    aux = torch.tensor([[[3.0, 4.0, 0.0, 2.0]]])
    out = noised_aux_hidden(aux, rows=[7], lengths=[1], n_aux=2, sigma=0.1, seed=3, step=5)
    eps = torch.randn(1, 4, generator=row_generator(3, 5, 7))[0].tolist()
    rms = [math.sqrt(12.5)] * 2 + [math.sqrt(2.0)] * 2
    want = [x + 0.1 * r * e for x, r, e in zip([3.0, 4.0, 0.0, 2.0], rms, eps)]
    assert out[0, 0].tolist() == pytest.approx(want, rel=1e-6)
    assert aux[0, 0].tolist() == [3.0, 4.0, 0.0, 2.0]  # the input is not changed in place


def test_same_row_same_noise_whatever_the_batch():
    """Row 11's noise does not depend on its batch neighbours, its place or the padded length
    (so 2-process DDP equals 1 process); padding stays as it was; another step or row draws
    other noise; sigma 0 returns the input itself."""
    g = torch.Generator().manual_seed(0)
    row11 = torch.randn(5, 6, generator=g)
    other = torch.randn(8, 6, generator=g)
    alone = torch.zeros(1, 5, 6)
    alone[0] = row11
    pair = torch.zeros(2, 8, 6)
    pair[0], pair[1, :5] = other, row11
    a = noised_aux_hidden(alone, [11], [5], 3, 0.2, seed=0, step=4)
    b = noised_aux_hidden(pair, [2, 11], [8, 5], 3, 0.2, seed=0, step=4)
    assert torch.equal(a[0], b[1, :5])
    assert torch.equal(b[1, 5:], torch.zeros(3, 6))  # padding untouched
    assert not torch.equal(a[0], row11)
    c = noised_aux_hidden(alone, [11], [5], 3, 0.2, seed=0, step=5)
    d = noised_aux_hidden(alone, [12], [5], 3, 0.2, seed=0, step=4)
    assert not torch.equal(a, c) and not torch.equal(a, d)
    assert noised_aux_hidden(alone, [11], [5], 3, 0.0, seed=0, step=4) is alone


def test_noise_size_is_relative_per_layer():
    """Layers a million times apart in scale get noise of the same relative size."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4000, 2 * 64, generator=g)
    x[..., 64:] *= 1e6
    out = noised_aux_hidden(x, [0], [4000], 2, 0.05, seed=0, step=0)
    rel = ((out - x).view(4000, 2, 64).pow(2).mean(-1) / x.view(4000, 2, 64).pow(2).mean(-1))
    assert rel.mean(0).sqrt().tolist() == pytest.approx([0.05, 0.05], rel=0.02)


def test_bad_shapes_raise():
    aux = torch.zeros(2, 4, 6)
    with pytest.raises(ValueError, match="1 rows / 1 lengths for a batch of 2"):
        noised_aux_hidden(aux, [1], [4], 3, 0.1, 0, 0)
    with pytest.raises(ValueError, match="row 9 has 5 tokens"):
        noised_aux_hidden(aux, [1, 9], [4, 5], 3, 0.1, 0, 0)
    with pytest.raises(ValueError, match="not 4 aux layers"):
        noised_aux_hidden(aux, [1, 2], [4, 4], 4, 0.1, 0, 0)


def test_loop_noises_training_steps_only(run_dir, verifier, source, monkeypatch):
    """The aux states a training step's batches carry equal noised_aux_hidden of the step's
    clean rows (lengths and aux count as the source has them); validation draws no noise."""
    from specdraft.train import loop
    from specdraft.train.config import TrainConfig
    from specdraft.train.run import run

    seen, calls, in_eval = [], [], [False]
    real_load, real_eval, real_noise = (loop.Trainer.load_train, loop.Trainer.evaluate,
                                        loop.noised_aux_hidden)

    def load_train(self, mb):
        batch = real_load(self, mb)
        seen.append((self.step, tuple(mb), batch.aux_hidden, self.load(mb).aux_hidden))
        return batch

    def evaluate(self):
        in_eval[0] = True
        try:
            return real_eval(self)
        finally:
            in_eval[0] = False

    def noise(*args, **kw):
        calls.append(in_eval[0])
        return real_noise(*args, **kw)

    monkeypatch.setattr(loop.Trainer, "load_train", load_train)
    monkeypatch.setattr(loop.Trainer, "evaluate", evaluate)
    monkeypatch.setattr(loop, "noised_aux_hidden", noise)
    cfg = TrainConfig(run_dir=run_dir, max_steps=3, epochs=10, ttt_steps=2, lr=1e-3,
                      warmup_steps=1, batch_tokens=36 * 4, val_fraction=0.2, eval_every=1,
                      save_every=3, log_every=1, hidden_noise=0.3, seed=4)
    m = run(cfg, verifier=verifier, source=source)
    assert m["steps"] == 3 and sorted({s for s, *_ in seen}) == [0, 1, 2]
    assert calls and not any(calls)  # called for every training batch, never in validation
    assert len(calls) == len(seen)
    for step, mb, noised, clean in seen:
        lengths = [len(source.get_batch([i])[0].input_ids) for i in mb]
        want = real_noise(clean, mb, lengths, 3, 0.3, seed=4, step=step)
        assert torch.equal(noised, want) and not torch.equal(noised, clean)
