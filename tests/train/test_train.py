"""End to end on a tiny random verifier: learning, outputs, exact resume, online == offline,
2-process gloo DDP == 1 process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from stubs import write_stub_manifest
import torch
from safetensors.torch import load_file

from specdraft.core.atomic import atomic_write_json
from specdraft.train.config import TrainConfig
from specdraft.train.run import run

HERE = Path(__file__).parent


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cfg(run_dir, **kw) -> TrainConfig:
    values = dict(run_dir=run_dir, epochs=1000, ttt_steps=3, lr=3e-3, warmup_steps=10,
                  batch_tokens=36 * 4, val_fraction=0.2, eval_every=50, save_every=50,
                  log_every=25)
    values.update(kw)
    return TrainConfig(**values)


def records(run_dir, split):
    lines = (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def weights(path):
    return load_file(str(path / "drafter.safetensors"))


def test_loss_falls_and_step0_accuracy_rises(run_dir, verifier, source):
    """200 CPU steps: the weighted loss at least halves and train step-0 accuracy > 0.7."""
    m = run(cfg(run_dir, max_steps=200), verifier=verifier, source=source)
    train = records(run_dir, "train")
    assert train[-1]["loss"] < 0.5 * train[0]["loss"]
    assert train[-1]["acc"][0] > 0.7 and train[0]["acc"][0] < 0.5
    out = run_dir / "train"
    for d in ("best", "last", "checkpoints/step-200"):
        assert (out / d / "drafter.safetensors").exists(), d
    assert (out / "checkpoints" / "step-200" / "train_state.pt").exists()
    assert any((out / "tb").iterdir())
    # best = the highest validation tau, not the last step
    val = records(run_dir, "val")
    best = max(val, key=lambda r: r["tau"])
    assert m["best_step"] == best["step"] and m["best_val"]["tau"] == best["tau"]
    assert m["counts"]["rows"] == 24 and m["steps"] == 200
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["final_val"]["cond_acc"]) == 3 and manifest["tokens_per_s"] > 0
    # embed_tokens frozen and equal to the verifier's
    w = weights(out / "last")
    assert torch.equal(w["embed_tokens.weight"], verifier.model.embed_tokens.weight)
    assert w["lm_head.weight"].shape == (len(w["d2t"]), 64)


@pytest.mark.parametrize("noise", [0.0, 0.2])
def test_exact_resume_after_a_crash(tmp_path, corpus, verifier, source, monkeypatch, noise):
    """Uninterrupted 12 steps == crash after step 6 (checkpoint at 4) + --resume (also with
    the aux-state noise, drawn from the step and the row)."""
    from memsource import crash_then_resume, write_vocab

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        write_vocab(d, corpus, 1024)
    kw = dict(max_steps=12, save_every=4, eval_every=4, log_every=1, grad_accum=2,
              hidden_noise=noise)
    m = crash_then_resume(run, cfg, a, b, kw, verifier=verifier, source=source,
                          monkeypatch=monkeypatch)
    assert m["resumed"]
    wa, wb = weights(a / "train" / "last"), weights(b / "train" / "last")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ra, rb = records(a, "train"), records(b, "train")
    assert [r["loss"] for r in ra] == [r["loss"] for r in rb] and len(ra) == 12


def test_online_equals_offline(tmp_path, corpus, verifier, source):
    """The verifier run inside the step (extract's OnlineSource over a prepared dataset) trains
    the same weights as the precomputed rows."""
    import datasets

    from memsource import write_vocab

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        write_vocab(d, corpus, 1024)
    ds = datasets.Dataset.from_dict({
        "input_ids": [x for _, x, _ in corpus], "loss_mask": [m for _, _, m in corpus],
        "sample_id": [k.split("/")[0] for k, _, _ in corpus], "turn_index": [0] * len(corpus),
        "seq_len": [len(x) for _, x, _ in corpus], "truncated": [False] * len(corpus)})
    ds.save_to_disk(str(b / "prepare" / "dataset"))
    write_stub_manifest(b / "prepare", "prepare")
    kw = dict(max_steps=6, eval_every=3, log_every=1)
    run(cfg(a, **kw), verifier=verifier, source=source)
    m = run(cfg(b, online=True, verifier="in-memory", aux_layers=(1, 2, 3), **kw),
            verifier=verifier)
    assert "prepare" in m.get("inputs", {"prepare": 1})
    wa, wb = weights(a / "train" / "last"), weights(b / "train" / "last")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("parallel, drafter", [("ddp", "eagle3"), ("fsdp", "eagle3"),
                                               ("ddp", "eagle3-noise"), ("ddp", "dflash"),
                                               ("ddp", "dflash-recipe")])
def test_two_process_gloo_ddp_equals_one_process(tmp_path, parallel, drafter):
    """torchrun --nproc-per-node 2 (grad_accum 1) == 1 process (grad_accum 2): same weights,
    with DDP and with FSDP2 (fully_shard); for DFlash too (its anchors are drawn per row from
    the step and the row's tokens, so they do not depend on the split; ``dflash-recipe``: with
    distinct anchors, D-PACE, soft labels and both acceptance terms; ``eagle3-noise``: with the
    aux-state noise, drawn per row)."""
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}  # the caller's source too
    worker = str(HERE / "ddp_worker.py")
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run([sys.executable, worker, str(one), "2", "ddp", drafter], check=True, env=env,
                   timeout=600)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-port", str(free_port()), worker, str(two), "1", parallel, drafter],
                   check=True, env=env, timeout=600)
    w1, w2 = weights(one / "train" / "last"), weights(two / "train" / "last")
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=1e-4, atol=1e-6)
    m1 = json.loads((one / "train" / "manifest.json").read_text())
    m2 = json.loads((two / "train" / "manifest.json").read_text())
    assert m2["world_size"] == 2 and m1["world_size"] == 1
    assert abs(m1["final_val"]["tau"] - m2["final_val"]["tau"]) < 1e-6
    if drafter.startswith("dflash"):  # the label counter sums the ranks' rows
        assert m1["verifier_argmax_differs"] == m2["verifier_argmax_differs"]
        assert m1["verifier_argmax_differs"]["positions"] > 0


def test_warmup_ratio_sets_the_warmup_from_the_run_s_steps(run_dir, verifier, source):
    """``warmup_ratio`` 0.25 of 8 steps is 2 warmup steps: the lr climbs by thirds of the peak
    (``lr_factor``'s ``(step + 1) / (warmup + 1)``) and step 2 takes the peak; 0.25 of 10 rounds
    up to 3 (transformers' rule); both settings at once are refused."""
    from pydantic import ValidationError

    from specdraft.train.loop import warmup_steps

    peak = 3e-3
    values = dict(run_dir=run_dir, epochs=1000, ttt_steps=1, lr=peak, warmup_ratio=0.25,
                  max_steps=8, batch_tokens=36 * 4, val_fraction=0.2, log_every=1)
    m = run(TrainConfig(**values), verifier=verifier, source=source)
    assert m["warmup_steps"] == 2
    lrs = [r["lr"] for r in records(run_dir, "train")]
    # logged after each step: the lr the next step takes; step 2 starts the cosine at the peak
    assert lrs[:2] == pytest.approx([peak * 2 / 3, peak], rel=1e-6) and max(lrs) == lrs[1]
    assert warmup_steps(TrainConfig(run_dir=run_dir, warmup_ratio=0.25), 10) == 3
    assert warmup_steps(TrainConfig(run_dir=run_dir, warmup_steps=9), 234) == 9
    assert warmup_steps(TrainConfig(run_dir=run_dir, warmup_steps=100), 50) == 25
    with pytest.raises(ValidationError, match="give one"):
        TrainConfig(run_dir=run_dir, warmup_ratio=0.04, warmup_steps=9)
