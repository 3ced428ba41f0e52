"""Every compute precision × every TTT attention implementation × device: the loss and the
gradients of one TTT unroll equal the dense fp32 reference within a stated tolerance, and
training in bf16 keeps fp32 master weights and AdamW moments.

Tolerances. bf16 keeps 8 significant bits: unit roundoff ``u = 2**-9 ≈ 2e-3`` (eps ``2**-8``).
Autocast rounds each matmul's inputs to bf16 (accumulation stays fp32), so every matmul adds a
relative error of a few ``u``; the loss goes through ~6 matmuls per TTT step, 3 steps chained,
and each gradient through twice as many. We allow ``4u ≈ 8e-3`` on the loss and ``25u ≈ 5e-2``
on each parameter's gradient, as ``‖g - g_ref‖ / ‖g_ref‖`` (measured on CPU: about 1e-4 on
the loss, the loss and softmax being fp32, and 1e-2 ≈ 5u on the gradients).
In fp32 the three attentions differ only in summation order: ``1e-5`` on the loss and ``1e-4``
on the gradients (fp32 ``u = 6e-8`` times the reduction lengths here).
"""

from typing import get_args

import pytest
import torch

from specdraft.models.eagle3 import TTT_ATTENTION
from specdraft.train.config import TrainConfig
from specdraft.train.loop import autocast_context
from specdraft.train.objective import TTTObjective
from test_objective import collator, random_row, tiny_drafter

U_BF16 = 2.0 ** -9
TOLERANCE = {"float32": (1e-5, 1e-4), "bfloat16": (4 * U_BF16, 25 * U_BF16)}  # (loss, grads)
DTYPES = [d for d in get_args(TrainConfig.model_fields["dtype"].annotation) if d != "auto"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))]


def batch():
    g = torch.Generator().manual_seed(3)
    return collator()([random_row("a/0", 21, 4, g), random_row("b/0", 15, 2, g),
                       random_row("c/0", 18, 9, g)])


def loss_and_grads(attn: str, dtype: str, device: str) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward/backward of a 3-step TTT unroll; fp32 loss and grads on the CPU."""
    obj = TTTObjective(tiny_drafter(attn), steps=3).to(device)
    b = batch().to(device)
    n = obj.loss_counts(b).clamp(min=1)
    with autocast_context(dtype, torch.device(device)):
        out = obj(b, n)
    out.loss.backward()
    grads = {k: p.grad.float().cpu() for k, p in obj.named_parameters() if p.grad is not None}
    return out.loss.item(), grads


@pytest.fixture(scope="module")
def reference():
    return loss_and_grads("dense", "float32", "cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attn", sorted(TTT_ATTENTION))
@pytest.mark.parametrize("dtype", DTYPES)
def test_loss_and_grads_equal_dense_fp32(reference, dtype, attn, device):
    ref_loss, ref_grads = reference
    loss, grads = loss_and_grads(attn, dtype, device)
    loss_tol, grad_tol = TOLERANCE[dtype]
    assert abs(loss - ref_loss) <= loss_tol * abs(ref_loss), (loss, ref_loss)
    assert grads.keys() == ref_grads.keys() and len(grads) >= 8
    for name, g in grads.items():
        err = (g - ref_grads[name]).norm() / ref_grads[name].norm()
        assert err <= grad_tol, (name, float(err))


def test_bf16_is_not_a_no_op(reference):
    """The bf16 path really computes in bf16: its loss differs from fp32 (else the tolerance
    above would test nothing)."""
    assert loss_and_grads("fused", "bfloat16", "cpu")[0] != reference[0]


def test_bf16_training_keeps_fp32_master_weights_and_moments(tmp_path, corpus, verifier, source):
    """``specdraft train --dtype bfloat16`` with the default ``--attn-impl fused`` (it crashed
    in the fused kernel before): the saved weights and every AdamW moment are fp32, and the
    second moments are non-zero (the bf16 gradients reached the fp32 masters)."""
    from safetensors.torch import load_file

    from memsource import write_vocab
    from specdraft.train import checkpoint as ckpt
    from specdraft.train.run import run

    write_vocab(tmp_path, corpus, 1024)
    cfg = TrainConfig(run_dir=tmp_path, dtype="bfloat16", max_steps=2, ttt_steps=2,
                      batch_tokens=36 * 4, val_fraction=0.2, save_every=2, eval_every=2,
                      log_every=1, lr=1e-3, warmup_steps=0, teacher_check=False)
    assert cfg.attn_impl == "fused"
    m = run(cfg, verifier=verifier, source=source)
    assert m["steps"] == 2 and m["drafter_config"]["attn_impl"] == "fused"
    step = tmp_path / "train" / "checkpoints" / "step-2"
    weights = load_file(str(step / "drafter.safetensors"))
    assert {w.dtype for k, w in weights.items() if w.is_floating_point()} == {torch.float32}
    moments = torch.load(step / ckpt.STATE_FILE, weights_only=False)["optimizer"]["state"]
    assert moments and all(s[k].dtype == torch.float32 for s in moments.values()
                           for k in ("exp_avg", "exp_avg_sq"))
    assert all(float(s["exp_avg_sq"].abs().max()) > 0 for s in moments.values())


@pytest.mark.parametrize("dtype, device, native, hidden, want", [
    ("auto", "cuda", False, 64, "bfloat16"),     # any CUDA device
    ("auto", "cuda:1", False, 64, "bfloat16"),
    ("auto", "cpu", True, 576, "bfloat16"),      # SmolLM2's width: measured 1.26x, tau equal
    ("auto", "cpu", True, 512, "bfloat16"),      # the threshold itself
    ("auto", "cpu", True, 511, "float32"),
    ("auto", "cpu", True, 64, "float32"),        # the tests' drafter: measured 0.82x
    ("auto", "cpu", False, 4096, "float32"),     # no native bf16: never measured faster
    ("float32", "cuda", True, 4096, "float32"),  # explicit values are kept
    ("bfloat16", "cpu", False, 64, "bfloat16"),
])
def test_train_dtype_auto_rule(dtype, device, native, hidden, want):
    from specdraft.core.verifier import resolve_train_dtype

    assert resolve_train_dtype(dtype, device, hidden, native_bf16=native) == want


@pytest.mark.parametrize("flags, want", [
    ("fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni", True),
    ("fpu sse2 avx2 amx_bf16 amx_tile", True),
    ("fpu sse2 avx2 avx512f avx512bw", False),   # AVX-512 without its bf16 extension
    ("fpu sse2 avx512_bf16x", False),            # a whole flag, not a prefix
    (None, False),                               # no /proc/cpuinfo (macOS, Windows)
])
def test_native_bf16_probe_reads_cpu_flags(tmp_path, flags, want):
    from specdraft.core.verifier import cpu_has_native_bf16

    info = tmp_path / "cpuinfo"
    if flags is not None:
        info.write_text(f"processor\t: 0\nmodel name\t: x\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert cpu_has_native_bf16(info) is want


def test_train_auto_trains_in_the_dtype_the_rule_picks(tmp_path, corpus, verifier, source,
                                                        monkeypatch):
    """``train --dtype auto`` on a CPU with native bf16: a drafter as wide as the threshold
    computes in bf16 (its loss differs from the fp32 run's and the manifest says so); without
    native bf16 the same run is fp32, its loss equal to ``--dtype float32``'s."""
    import shutil

    from memsource import write_vocab
    from specdraft.core import verifier as rules
    from specdraft.train.run import run

    write_vocab(tmp_path / "base", corpus, 1024)

    def train(name, dtype, native):
        d = tmp_path / name
        shutil.copytree(tmp_path / "base", d)
        monkeypatch.setattr(rules, "cpu_has_native_bf16", lambda: native)
        monkeypatch.setattr(rules, "BF16_CPU_MIN_HIDDEN", 64)  # the tests' drafter width
        cfg = TrainConfig(run_dir=d, dtype=dtype, max_steps=2, ttt_steps=2, batch_tokens=36 * 4,
                          val_fraction=0.2, save_every=2, eval_every=2, log_every=1, lr=1e-3,
                          warmup_steps=0, teacher_check=False)
        return run(cfg, verifier=verifier, source=source)

    fp32 = train("fp32", "float32", native=True)
    native = train("native", "auto", native=True)
    plain = train("plain", "auto", native=False)
    assert native["drafter_config"]["hidden_size"] == 64
    assert (fp32["compute_dtype"], native["compute_dtype"], plain["compute_dtype"]) == \
        ("float32", "bfloat16", "float32")
    assert plain["final_val"]["loss"] == fp32["final_val"]["loss"]
    assert native["final_val"]["loss"] != fp32["final_val"]["loss"]
