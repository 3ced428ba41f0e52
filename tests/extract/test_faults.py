"""Resume after kill -9, and torchrun data parallelism, through the real CLI in subprocesses."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from killing import kill9_when
import torch

from specdraft.artifacts.hidden_states import DiskSource

from extract_helpers import random_rows, write_prepared

CLI = [sys.executable, "-c", "from specdraft.cli import main; main()", "extract"]


def flags(run_dir: Path, verifier: Path, *extra: str) -> list[str]:
    return ["--run-dir", str(run_dir), "--verifier", str(verifier), "--aux-layers", "1,2,3",
            "--batch-tokens", "256", "--storage", "bf16", "--shard-mb", "0.1", "--device", "cpu",
            *extra]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def digest(extract_dir: Path) -> dict[str, str]:
    files = [extract_dir / "index.jsonl", *sorted((extract_dir / "shards").iterdir())]
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


def make_run(tmp_path: Path, name: str, n: int) -> Path:
    lens = [24 + (7 * i) % 90 for i in range(n)]
    ids, masks = random_rows(lens, vocab=2000, seed=1)
    return write_prepared(tmp_path / name, ids, masks)


@pytest.mark.timeout(300)
def test_resume_after_kill_equals_uninterrupted(tmp_path, tiny_verifier_dir):
    killed = make_run(tmp_path, "killed", 300)
    shards = killed / "extract" / "shards"
    kill9_when(CLI + flags(killed, tiny_verifier_dir), env=env(), timeout_s=120,
               ready=lambda: shards.exists() and len(list(shards.glob("*.safetensors"))) >= 3)
    assert not (killed / "extract" / "manifest.json").exists()
    refused = subprocess.run(CLI + flags(killed, tiny_verifier_dir), env=env(),
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "--resume" in refused.stderr
    subprocess.run(CLI + flags(killed, tiny_verifier_dir, "--resume"), env=env(), check=True,
                   capture_output=True)
    clean = make_run(tmp_path, "clean", 300)
    subprocess.run(CLI + flags(clean, tiny_verifier_dir), env=env(), check=True,
                   capture_output=True)
    resumed = DiskSource(killed / "extract").manifest
    assert resumed.throughput[0]["shards_resumed"] >= 2  # the 3rd may be unlisted
    assert digest(killed / "extract") == digest(clean / "extract")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_torchrun_two_ranks_equal_one_process(tmp_path, tiny_verifier_dir):
    one = make_run(tmp_path, "one", 40)
    two = make_run(tmp_path, "two", 40)
    subprocess.run(CLI + flags(one, tiny_verifier_dir), env=env(), check=True,
                   capture_output=True)
    script = tmp_path / "cli.py"
    script.write_text("from specdraft.cli import main\nmain()\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", "29517", str(script), "extract", *flags(two, tiny_verifier_dir)]
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = DiskSource(one / "extract"), DiskSource(two / "extract")
    assert a.keys() == b.keys()
    assert b.manifest.world_size == 2
    names = {p.name.split("-")[0] for p in (two / "extract" / "shards").iterdir()}
    assert names == {"rank00000", "rank00001"}
    strip = lambda e: {k: v for k, v in e.items() if k not in ("shard", "tok", "sup")}  # noqa
    assert [strip(e) for e in a._entries] == [strip(e) for e in b._entries]
    for x, y in zip(a.get_batch(range(len(a))), b.get_batch(range(len(b)))):
        for name in ("input_ids", "loss_mask", "aux_hidden", "final_hidden",
                     "target_positions"):
            assert torch.equal(getattr(x, name), getattr(y, name)), (x.key, name)


def test_resume_distrusts_torn_index_orphans_and_temp_files(tmp_path, tiny_model):
    """The states a kill -9 can leave, made by hand: each is repaired and recomputed."""
    from specdraft.extract.config import ExtractConfig
    from specdraft.extract.run import run

    run_dir = make_run(tmp_path, "run", 30)
    cfg = {"run_dir": run_dir, "verifier": "tiny", "aux_layers": (1, 2, 3),
           "batch_tokens": 256, "storage": "bf16", "shard_mb": 0.1}
    first = run(ExtractConfig(**cfg), verifier=tiny_model)
    out = run_dir / "extract"
    before = digest(out)
    n_shards = first["storage"]["shards"]
    assert n_shards >= 4
    part = out / "index.rank00000.jsonl"
    lines = part.read_text().splitlines(keepends=True)
    last_shard = lines[-1].split('"shard": "')[1].split('"')[0]
    part.write_text("".join(lines[:-1]) + lines[-1][:20])  # torn tail: shard incomplete
    shards = sorted((out / "shards").iterdir())
    shards[1].write_bytes(shards[1].read_bytes()[:50])  # listed but unreadable
    (out / "shards" / "rank00000-000099.safetensors").write_bytes(b"orphan")
    (out / "shards" / "rank00000-000002.safetensors.tmp-123").write_bytes(b"half")
    staging = out / "shards" / "rank00000-000003.safetensors.tmp-456"  # atomic_save_safetensors'
    staging.mkdir()
    (staging / ".tmpAb12Cd").write_bytes(b"half")  # safetensors' own temp file inside it
    (out / "manifest.json").unlink()
    m = run(ExtractConfig(**cfg, resume=True), verifier=tiny_model)
    assert m["throughput"][0]["shards_resumed"] == n_shards - 2
    assert m["throughput"][0]["shards_written"] == 2  # shards[1] and the torn last one
    assert last_shard.endswith(f"{n_shards - 1:06d}.safetensors")
    assert digest(out) == before
