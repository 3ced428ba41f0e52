"""``benchmarks/bench_train_peer.py``'s specdraft child runs against today's trainer API (it
broke silently once when ``build_drafter`` started taking a verifier profile): two steps on
two 64-token rows, then the timing file the parent reads."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_train_peer  # noqa: E402


def test_specdraft_child_trains_and_reports_step_times(tmp_path):
    threads = torch.get_num_threads()
    try:
        bench_train_peer.build(tmp_path / "work", n_rows=2, T=64)
        bench_train_peer.specdraft_child(tmp_path / "work", steps=1, T=64,
                                         result=tmp_path / "res.json")
    finally:
        torch.set_num_threads(threads)
    times = json.loads((tmp_path / "res.json").read_text())["step_s"]
    assert len(times) == 2 and all(math.isfinite(t) and t > 0 for t in times)
    assert (tmp_path / "work" / "peer" / "d2t.npy").exists()  # the peer's input was built too
