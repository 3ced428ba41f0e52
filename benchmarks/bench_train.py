"""Training throughput of a SmolLM2-sized drafter: tokens/s and peak memory per TTT attention
path (H=576, 9 heads / 3 kv heads, head_dim 64, intermediate 1536, draft vocab 32000,
V=49152, one row of 2048 tokens, TTT 7, AdamW step included). On CUDA also the model FLOP
utilisation (matmul FLOPs of forward+backward / time / --peak-tflops; every column counted, so
under `--columns live` an effective rate).

    python benchmarks/bench_train.py [--device cpu|cuda] [--steps 3] [--seq 2048] [--profile]
        [--dtype float32,bfloat16] [--columns live,all] [--sup-from 0.5] [--draft-vocab 8192]
        [--rows 8] [--head fused,plain]

``--dtype``: the compute precisions to time, as ``specdraft train --dtype`` applies them
(:func:`specdraft.train.loop.autocast_context`: fp32, or bf16 autocast over fp32 master
weights; ``auto``, the default, is bf16 on CUDA and fp32 on CPU).

``--profile``: one more step under ``torch.profiler``; prints the operators by self CPU time
(where the step's time goes: the draft-vocab head's matmuls, the softmax/loss, attention).
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from specdraft.core.verifier import resolve_train_dtype
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel
from specdraft.train.loop import autocast_context
from specdraft.artifacts.batches import TrainBatch
from specdraft.train.objective import TTTObjective


def smollm2_drafter(attn: str, draft_vocab: int = 32000) -> Eagle3DraftModel:
    c = Eagle3Config(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                     intermediate_size=1536, rms_norm_eps=1e-5, rope_theta=100000.0,
                     max_position_embeddings=8192, vocab_size=49152, draft_vocab_size=draft_vocab,
                     target_hidden_size=576, aux_layer_ids=(2, 15, 27), attn_impl=attn)
    return Eagle3DraftModel(c)


def batch(T: int, K: int, device: str, sup_from: float = 0.0, rows: int = 1) -> TrainBatch:
    """``rows`` random rows of ``T // rows`` tokens each; in each, positions before ``sup_from``
    of its length are unsupervised (a prompt)."""
    g = torch.Generator().manual_seed(0)
    B, T = rows, T // rows
    probs = torch.softmax(torch.randn(B, T, K, generator=g) * 3, -1)
    sup = torch.ones(B, T, dtype=torch.bool)
    sup[:, :int(sup_from * T)] = False
    label = torch.where(sup, torch.randint(0, K, (B, T), generator=g), -1)
    return TrainBatch(torch.randint(0, 49152, (B, T), generator=g),
                      torch.randn(B, T, 3 * 576, generator=g), sup, probs[sup], label,
                      B * T).to(device)


def flops_per_token(c: Eagle3Config, steps: int, T: int) -> float:
    """Matmul FLOPs per token, forward + backward (x3): fc once, then per step the layer
    (q/k/v from 2H, o, MLP), the attention scores/values (causal ~T/2 keys) and lm_head."""
    H, I, K = c.hidden_size, c.intermediate_size, c.draft_vocab_size
    qkv = 2 * H * (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    layer = qkv + c.num_attention_heads * c.head_dim * H + 3 * H * I + H * K
    attn = 2 * c.num_attention_heads * c.head_dim * (T / 2)
    return 3 * 2 * (3 * H * H + steps * (layer + attn))


def one_step(obj: TTTObjective, opt: torch.optim.Optimizer, b: TrainBatch, norm: torch.Tensor,
             ctx) -> None:
    """Forward, backward, clip 0.5, AdamW step."""
    with ctx:
        out = obj(b, norm)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(obj.parameters(), 0.5)
    opt.step()
    opt.zero_grad(set_to_none=True)


def profile_step(step, rows: int = 15) -> str:
    """``torch.profiler`` table of one call of ``step``: operators by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def bench(attn: str, device: str, steps: int, T: int, ttt: int, profile: bool = False,
          sup_from: float = 0.0, dtype: str = "auto", columns: str = "live",
          draft_vocab: int = 32000, rows: int = 1, head: str = "fused") -> dict:
    torch.manual_seed(0)
    model = smollm2_drafter(attn, draft_vocab).to(device)
    obj = TTTObjective(model, steps=ttt, columns=columns, head=head)
    opt = torch.optim.AdamW([p for p in obj.parameters() if p.requires_grad], lr=1e-4,
                            betas=(0.9, 0.95))
    b = batch(T, model.config.draft_vocab_size, device, sup_from, rows)
    norm = obj.loss_counts(b)
    dtype = resolve_train_dtype(dtype, device, model.config.hidden_size)
    ctx = autocast_context(dtype, torch.device(device))
    times = []
    for i in range(steps + 1):  # the first step warms up
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        one_step(obj, opt, b, norm, ctx)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if profile:
        print(profile_step(lambda: one_step(obj, opt, b, norm, ctx)), flush=True)
    dt = sum(times[1:]) / steps
    r = {"attn": attn, "device": device, "dtype": dtype, "seq": T, "ttt": ttt,
         "rows": rows, "columns": columns, "head": head, "sup_from": sup_from,
         "draft_vocab": draft_vocab,
         "s_per_step": round(dt, 3),
         "tokens_per_s": round(T / dt, 1)}
    if device == "cuda":
        r["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)
        r["tflops"] = round(flops_per_token(model.config, ttt, T) * T / dt / 1e12, 1)
    else:
        r["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--ttt", type=int, default=7)
    ap.add_argument("--attn", default="split,dense")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak (H100/H200)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sup-from", type=float, default=0.0,
                    help="fraction of each row before the first supervised position")
    ap.add_argument("--dtype", default="auto", help="comma-separated: auto, float32, bfloat16")
    ap.add_argument("--columns", default="live", help="comma-separated: live (the layer only "
                    "at the columns some TTT step supervises, the default), all (every column)")
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--rows", type=int, default=1, help="rows the --seq tokens are split into")
    ap.add_argument("--head", default="fused", help="comma-separated: fused (the head, soft "
                    "cross-entropy and hits in row chunks, the default), plain (logits [N, K])")
    a = ap.parse_args()
    for dtype in a.dtype.split(","):
        for attn in a.attn.split(","):
            for columns in a.columns.split(","):
                for head in a.head.split(","):
                    r = bench(attn, a.device, a.steps, a.seq, a.ttt, a.profile, a.sup_from,
                              dtype, columns, a.draft_vocab, a.rows, head)
                    if "tflops" in r:
                        r["mfu"] = round(r["tflops"] / a.peak_tflops, 3)
                    print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
