"""Faults while writing: the disk fills up (ENOSPC, injected at the N-th fsync: every durable
specdraft write ends in one) or the run directory is read-only (a real read-only mount when
this process may mount, else a chmod'ed directory for non-root). The CLI reports one line and
exit 2; nothing half-written is under a final name; `--resume` after freeing space gives the
artifacts of an uninterrupted run."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from malformed import write_lines
from specdraft.generate.fakeserver import LoopbackServer

TESTS = Path(__file__).resolve().parents[1]


class DiskFull:
    """``os.fsync`` raises ENOSPC from its ``after + 1``-th call on, until :meth:`free`."""

    def __init__(self, monkeypatch, after: int) -> None:
        self.calls, self.after, self.full = 0, after, True
        real = os.fsync

        def fsync(fd):
            self.calls += 1
            if self.full and self.calls > self.after:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def free(self) -> None:
        self.full = False


def _assert_disk_full_error(res, run) -> None:
    err = res.error
    assert "No space left on device (ENOSPC)" in err and "--resume" in err, err
    assert f": {run}/" in err, err  # the file being written is named


# ---------------------------------------------------------------- generate

def _generate(cli, url, run, prompts, *extra):
    return cli("generate", "--prompts", prompts, "--run-dir", run, "--backend", "openai",
               "--endpoint", url, "--max-tokens", "8", "--concurrency", "1", *extra)


def _samples(run: Path) -> list[dict]:
    """samples.jsonl without the wall-clock fields (the only thing two runs may differ in)."""
    out = []
    for line in (run / "generate/samples.jsonl").read_text().splitlines():
        rec = json.loads(line)
        for t in rec["turns"]:
            t.pop("latency_s", None)
        out.append(rec)
    return sorted(out, key=lambda r: r["id"])


@pytest.mark.parametrize("after", [0, 1])
def test_generate_disk_full_then_resume_equals_uninterrupted(tmp_path, cli, monkeypatch, after):
    prompts = write_lines(tmp_path / "p.jsonl", [{"question": f"q{i}"} for i in range(40)])
    with LoopbackServer() as url:
        assert _generate(cli, url, tmp_path / "clean", prompts).code == 0
        disk = DiskFull(monkeypatch, after)
        _assert_disk_full_error(_generate(cli, url, tmp_path / "full", prompts), tmp_path / "full")
        assert not (tmp_path / "full/generate/manifest.json").exists()
        disk.free()
        res = _generate(cli, url, tmp_path / "full", prompts, "--resume")
    assert res.code == 0, res.err
    assert _samples(tmp_path / "full") == _samples(tmp_path / "clean")
    assert len(_samples(tmp_path / "clean")) == 40


def _mount_read_only(path: Path) -> str:
    """Make ``path`` read-only for this process: "mount" or "chmod"; skip when neither can."""
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        return "chmod"
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
                        capture_output=True)
    if ok.returncode != 0:
        from prerequisites import missing

        missing("root without mount permission: no read-only directory can be made",
                "run the tests as a non-root user, or as root allowed to mount tmpfs")
    return "mount"


def test_generate_read_only_run_dir(tmp_path, cli):
    run = tmp_path / "ro"
    how = _mount_read_only(run)
    prompts = write_lines(tmp_path / "p.jsonl", [{"question": "q"}])
    try:
        with LoopbackServer() as url:
            err = _generate(cli, url, run, prompts).error
    finally:
        if how == "mount":
            subprocess.run(["umount", str(run)], check=True)
        else:
            run.chmod(0o755)
    want = "Read-only file system (EROFS)" if how == "mount" else "Permission denied (EACCES)"
    assert want in err and f"{run}/generate" in err, err


# ---------------------------------------------------------------- extract

def _extract_run(tmp_path: Path, name: str) -> Path:
    sys.path.insert(0, str(TESTS / "extract"))
    from extract_helpers import random_rows, write_prepared

    lens = [24 + (7 * i) % 90 for i in range(60)]
    ids, masks = random_rows(lens, vocab=2000, seed=1)
    return write_prepared(tmp_path / name, ids, masks)


def _digest(extract_dir: Path) -> dict[str, str]:
    files = [extract_dir / "index.jsonl", *sorted((extract_dir / "shards").iterdir())]
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


@pytest.mark.slow
def test_extract_disk_full_then_resume_equals_uninterrupted(tmp_path, cli, monkeypatch,
                                                            tiny_verifier_dir):
    def extract(run, *extra):
        return cli("extract", "--run-dir", run, "--verifier", tiny_verifier_dir, "--aux-layers",
                   "1,2,3", "--batch-tokens", "256", "--storage", "bf16", "--shard-mb", "0.02",
                   "--device", "cpu", *extra)

    clean, full = _extract_run(tmp_path, "clean"), _extract_run(tmp_path, "full")
    counter = DiskFull(monkeypatch, after=10**9)  # counts the fsyncs of a whole extraction
    assert extract(clean).code == 0
    disk = DiskFull(monkeypatch, after=counter.calls // 2)  # the disk fills half-way through
    _assert_disk_full_error(extract(full), full)
    out = full / "extract"
    assert not (out / "manifest.json").exists()
    written = sorted(p.name for p in (out / "shards").iterdir())
    assert written and len(written) < len(list((clean / "extract/shards").iterdir()))
    disk.free()
    res = extract(full, "--resume")
    assert res.code == 0, res.err
    assert _digest(out) == _digest(clean / "extract")


# ---------------------------------------------------------------- train checkpoints

def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)
    return model


@pytest.mark.slow
def test_train_checkpoint_disk_full_then_resume_equals_uninterrupted(tmp_path, monkeypatch):
    sys.path.insert(0, str(TESTS / "train"))
    from memsource import MemorySource, greedy_corpus, write_vocab
    from safetensors.torch import load_file

    from specdraft.train import checkpoint
    from specdraft.train.config import TrainConfig
    from specdraft.train.run import run

    verifier = _tiny_llama()
    corpus = greedy_corpus(verifier, 24, vocab_range=1024)
    source = MemorySource(verifier, corpus)
    kw = dict(epochs=1000, ttt_steps=3, lr=3e-3, warmup_steps=10, batch_tokens=36 * 4,
              val_fraction=0.2, max_steps=12, save_every=4, eval_every=4, log_every=1)
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        write_vocab(d, corpus, 1024)
    run(TrainConfig(run_dir=a, **kw), verifier=verifier, source=source)

    real = checkpoint.save_drafter

    def fill_up(drafter, tmp):  # the disk fills while step-8 is being written
        real(drafter, tmp)
        if Path(tmp).name.startswith("step-8"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint, "save_drafter", fill_up)
    with pytest.raises(OSError) as err:
        run(TrainConfig(run_dir=b, **kw), verifier=verifier, source=source)
    assert err.value.errno == errno.ENOSPC
    ckpts = sorted(p.name for p in (b / "train/checkpoints").iterdir())
    assert ckpts == ["step-4"]  # no half-written step-8 under its final name
    monkeypatch.setattr(checkpoint, "save_drafter", real)
    m = run(TrainConfig(run_dir=b, resume=True, **kw), verifier=verifier, source=source)
    assert m["resumed"]
    wa, wb = (load_file(str(d / "train/last/drafter.safetensors")) for d in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
