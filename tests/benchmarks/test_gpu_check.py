"""``benchmarks/gpu_check.py``, the GPU check of issue #39, dry-run on the CPU as CI runs it
(``--device cpu --tiny``): every check prints PASS with real figures, a planted gradient error
and a too-tight tolerance make the fp32 comparison FAIL, the deadline turns checks into SKIP,
and the FLOP count behind the MFU equals torch's own count of the matmuls plus the attention
term computed here by hand."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
CHECKS = ["train_h4096_fp32", "train_kimi_mla_fp32", "extract_cuda_vs_cpu", "train_h4096_bf16",
          "train_kimi_mla_bf16"]
LINE = re.compile(r"^gpu_check (\S+) (PASS|FAIL|SKIP) ?(.*)$")


def run(*args: str, json_path: Path | None = None) -> tuple[int, dict[str, tuple[str, dict]]]:
    """Run the script; (exit status, {check: (status, figures)}) from its summary lines."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("OUT", None)
    extra = ["--json", str(json_path)] if json_path else []
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", *args,
                           *extra], capture_output=True, text=True, env=env, timeout=600)
    lines = {}
    for line in proc.stdout.splitlines():
        m = LINE.match(line)
        if m and m.group(1) not in ("env", "done"):
            figures = dict(kv.split("=", 1) for kv in m.group(3).split(" error:")[0].split()
                           if "=" in kv)
            lines[m.group(1)] = (m.group(2), figures)
    assert lines, proc.stdout + proc.stderr
    return proc.returncode, lines


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpu_check") / "gpu_check.jsonl"
    rc, lines = run(json_path=path)
    return rc, lines, [json.loads(x) for x in path.read_text().splitlines()]


def test_dry_run_passes_every_check_with_real_figures(dry_run):
    rc, lines, records = dry_run
    assert rc == 0 and list(lines) == CHECKS
    assert {name: status for name, (status, _) in lines.items()} == dict.fromkeys(CHECKS, "PASS")
    for name in ("train_h4096_fp32", "train_kimi_mla_fp32"):
        f = lines[name][1]
        tol = float(f["tol"])
        assert tol == 1e-4
        # fused (the CPU flash kernel) and split are different computations: > 0, within tol
        assert 0 < float(f["grad_rel_max"]) <= tol and float(f["loss_rel"]) <= tol
        assert 0 < float(f["grad_abs_max"]) and int(f["n_grads"]) >= 12
    assert lines["train_kimi_mla_fp32"][1]["head_dim"] == "32"  # MLA q/k: 16 nope + 16 rope
    ext = lines["extract_cuda_vs_cpu"][1]
    assert float(ext["llama_rel"]) == 0 and float(ext["kimi_rel"]) == 0  # cpu against cpu
    assert 0 < float(ext["llama_fp32_vs_fp64"]) < float(ext["tol"])  # fp32 rounding, for scale
    for name in ("train_h4096_bf16", "train_kimi_mla_bf16"):
        f = {k: float(v) for k, v in lines[name][1].items() if k != "tol"}
        assert f["tokens_per_s"] > 0 and f["peak_gib"] > 0 and math.isfinite(f["grad_norm"])
        assert f["tokens_per_s"] == pytest.approx(f["rows"] * f["T"] / f["step_s"], rel=2e-3)
        assert f["mfu"] == pytest.approx(f["tflops"] / 790, rel=1e-2)
        assert 0 < f["loss_rel"] <= 0.02  # bf16 and fp32 differ, within the tolerance
    assert [r["check"] for r in records] == CHECKS
    assert all(r["status"] == "PASS" and r["device"] == "cpu" for r in records)
    assert records[0]["grad_rel_max"] == pytest.approx(
        float(lines["train_h4096_fp32"][1]["grad_rel_max"]), rel=1e-3)


def test_planted_gradient_error_and_tight_tolerance_fail():
    rc, lines = run("--only", "train_h4096_fp32", "--plant-fault", "grad")
    status, f = lines["train_h4096_fp32"]
    assert rc == 1 and status == "FAIL"
    assert float(f["grad_rel_max"]) == pytest.approx(0.01, rel=0.01)  # the planted 1 %
    rc, lines = run("--only", "train_kimi_mla_fp32", "--fp32-tol", "1e-9")
    assert rc == 1 and lines["train_kimi_mla_fp32"][0] == "FAIL"


def test_past_the_deadline_every_check_is_skipped():
    rc, lines = run("--deadline-s", "0")
    assert rc == 0 and {n: s for n, (s, _) in lines.items()} == dict.fromkeys(CHECKS, "SKIP")


def test_flop_count_is_torch_matmul_count_plus_the_causal_attention():
    """The linear layers' FLOPs of a forward + backward, counted by torch's FlopCounterMode
    (the fused CPU attention kernel is not in its table), plus the attention term by hand."""
    from torch.utils.flop_counter import FlopCounterMode

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    from specdraft.train.objective import TTTObjective

    dev, steps, T = torch.device("cpu"), 3, 48
    for kind, (heads, d_qk, d_v) in {"h4096": (4, 16, 16), "kimi": (2, 32, 16)}.items():
        model = gpu_check.build_drafter(kind, True, dev, 256)
        obj = TTTObjective(model, steps=steps)
        batch = gpu_check.make_batch(model, 2, T, dev)
        with FlopCounterMode(display=False) as counter:
            gpu_check.ttt_step(obj, batch, "float32", dev)
        L = T - 1
        pairs = sum(L * (L + 1) / 2 + k * L for k in range(steps))
        attention = 3 * 2 * 2 * heads * (d_qk + d_v) * pairs  # 3 = forward + 2 x backward
        assert counter.get_total_flops() > 0
        assert gpu_check.train_flops(model, batch, steps) == counter.get_total_flops() + attention


def test_drafter_rotary_takes_the_call_of_the_h200s_transformers():
    """transformers 5.17 (the lent H200's) calls ``rope_init_fn(config, device)``, 5.25 (this
    venv's) ``rope_init_fn(config)``: the drafter's default rotary answers both alike (it raised
    TypeError under 5.17, found by the dry run with transformers 5.17 on the path)."""
    from specdraft.models.eagle3 import DraftRotaryEmbedding, Eagle3Config

    c = Eagle3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     intermediate_size=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                     max_position_embeddings=128, vocab_size=512, draft_vocab_size=256,
                     target_hidden_size=64, aux_layer_ids=(1, 2, 3), partial_rotary_factor=0.5)
    rc = c.rotary_config()
    new, scale = DraftRotaryEmbedding.compute_default_rope_parameters(rc)
    old, scale_old = DraftRotaryEmbedding.compute_default_rope_parameters(rc, torch.device("cpu"))
    expected = 1.0 / 10000.0 ** (torch.arange(0, 8, 2).float() / 8)  # rotary dim 16 * 0.5
    assert torch.equal(new, old) and scale == scale_old == 1.0
    torch.testing.assert_close(new, expected)
