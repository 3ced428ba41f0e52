"""`specdraft train` killed with SIGKILL after a checkpoint, then `--resume`: the final weights
equal an uninterrupted run's bit for bit (CPU, fixed seed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from killing import kill9_when
import torch
from safetensors.torch import load_file

from specdraft.pipeline.config import PipelineConfig
from specdraft.pipeline.run import run
from test_pipeline import write_config


def train_cmd(run_dir, *extra):
    return [sys.executable, "-m", "specdraft.cli", "train", "--run-dir", str(run_dir),
            "--epochs", "200", "--max-steps", "60", "--save-every", "10", "--eval-every", "10",
            "--ttt-steps", "2", "--batch-tokens", "256", "--warmup-steps", "2",
            "--val-fraction", "0.34", *extra]


@pytest.mark.timeout(600)
def test_kill9_then_resume_equals_uninterrupted(tmp_path, verifier8):
    killed = tmp_path / "killed"
    cfg = write_config(tmp_path / "k.yaml", killed, verifier8)
    run(PipelineConfig.from_yaml(cfg), until="extract")
    clean = tmp_path / "clean"
    shutil.copytree(killed, clean)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    ckpts = killed / "train" / "checkpoints"
    kill9_when(train_cmd(killed), env=env, ready=lambda: ckpts.exists() and any(
        p.name.startswith("step-") and ".tmp" not in p.name for p in ckpts.iterdir()))
    assert not (killed / "train" / "manifest.json").exists()

    subprocess.run(train_cmd(killed, "--resume"), env=env, check=True, capture_output=True)
    assert json.loads((killed / "train" / "manifest.json").read_text())["resumed"]
    subprocess.run(train_cmd(clean), env=env, check=True, capture_output=True)
    a = load_file(str(killed / "train" / "last" / "drafter.safetensors"))
    b = load_file(str(clean / "train" / "last" / "drafter.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
