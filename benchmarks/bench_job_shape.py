"""One training step of a drafter at the Kimi-K2.5 job's shape, measured on CPU.

Shape (issue #24 item 5): hidden 7,168, 64 heads of 128, 8 KV heads, intermediate 18,432 (the
verifier's layer shape, the drafter's default), draft vocab K = 32,000, aux ids (2, 30, 58);
rows of 2,048 and 4,096 tokens, every position supervised; TTT steps 1, 2, 3 (and 7 where the
memory allows); the default attention (``fused``) and the compute precision ``train --dtype auto``
picks on this CPU (bf16 autocast over fp32 master weights when the CPU has avx512_bf16/amx).

Each (T, steps) runs in a fresh process: build the drafter, one forward + backward of
:class:`specdraft.train.objective.TTTObjective` on a random row (soft targets over K), no
optimizer step. Reported: seconds (forward and in all), the bytes autograd keeps for backward
(every saved tensor's storage counted once, through ``torch.autograd.graph.saved_tensors_hooks``:
autocast's bf16 copies of the weights, a fixed part, plus the activations of the row, which grow
with T and the TTT steps), and the peak RSS growth of the process after the drafter was built
(what was alive at once: saved tensors, then gradients, 4 B per trainable parameter, as the
backward frees them; not their sum). Weights, gradients and AdamW's two moments are exact counts
(16 B per trainable parameter, 4 B per frozen one), printed beside. Also printed: this CPU's rate
on one bf16 ``[2048, 7168] x [7168, 7168]`` product (the denominator of the efficiency quoted in
docs/scale.md). The drafter is the Llama layer.

The verifier's embedding (V = 163,840 rows, frozen, looked up only) is built with K rows here to
fit this machine's 24 GiB: its cost is V·H·4 bytes of memory and no FLOPs, added by formula.

    python benchmarks/bench_job_shape.py [--rows 2048,4096] [--steps 1,2,3] [--full-ttt 7]

docs/scale.md's table: ``--rows 128 --steps 1 --full-ttt 0``, ``--rows 2048 --steps 1,2,3
--full-ttt 7`` and ``--rows 4096 --steps 1,2 --full-ttt 0`` (24 GiB holds no more at 4,096).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

H, HEADS, KV, HEAD_DIM, INTER, K, V_KIMI = 7168, 64, 8, 128, 18_432, 32_000, 163_840
GB = 1e9


def drafter(vocab: int):
    from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel

    c = Eagle3Config(hidden_size=H, num_attention_heads=HEADS, num_key_value_heads=KV,
                     head_dim=HEAD_DIM, intermediate_size=INTER, rms_norm_eps=1e-6,
                     rope_theta=50_000.0, max_position_embeddings=262_144, vocab_size=vocab,
                     draft_vocab_size=K, target_hidden_size=H, aux_layer_ids=(2, 30, 58))
    return Eagle3DraftModel(c)


def child(T: int, steps: int, dtype: str) -> None:
    import torch

    from specdraft.artifacts.batches import TrainBatch
    from specdraft.train.loop import autocast_context
    from specdraft.train.objective import TTTObjective

    torch.manual_seed(0)
    model = drafter(K)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    obj = TTTObjective(model, steps=steps)
    g = torch.Generator().manual_seed(0)
    sup = torch.ones(1, T, dtype=torch.bool)
    batch = TrainBatch(torch.randint(0, K, (1, T), generator=g),
                       torch.randn(1, T, 3 * H, generator=g), sup,
                       torch.softmax(torch.randn(T, K, generator=g) * 3, -1),
                       torch.randint(0, K, (1, T), generator=g), T)
    norm = obj.loss_counts(batch)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        """Count each storage autograd keeps for backward once (views share one)."""
        st = t.untyped_storage()
        saved[st.data_ptr()] = st.nbytes()
        return t

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with autocast_context(dtype, torch.device("cpu")):
            out = obj(batch, norm)
    t1 = time.perf_counter()
    out.loss.backward()
    t2 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"T": T, "steps": steps, "s": round(t2 - t0, 1),
                      "forward_s": round(t1 - t0, 1), "saved_for_backward_gb":
                      round(sum(saved.values()) / GB, 2),
                      "peak_rss_growth_gb": round((peak - base) / GB, 2),
                      "trainable": trainable}))


def matmul_gflops() -> float:
    """This CPU's rate on one bf16 ``[2048, 7168] x [7168, 7168]`` product (after a warm-up)."""
    import torch

    a, b = torch.randn(2048, H, dtype=torch.bfloat16), torch.randn(H, H, dtype=torch.bfloat16)
    a @ b
    t0 = time.perf_counter()
    a @ b
    return round(2 * 2048 * H * H / (time.perf_counter() - t0) / 1e9, 1)


def run(T: int, steps: int, dtype: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", f"{T},{steps},{dtype}"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return {"T": T, "steps": steps, "error": out.stderr.strip().splitlines()[-1:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="2048,4096")
    ap.add_argument("--steps", default="1,2,3")
    ap.add_argument("--full-ttt", type=int, default=7, help="also run this many steps at the "
                    "first row length (0: skip)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        T, steps, dtype = a.child.split(",")
        child(int(T), int(steps), dtype)
        return
    from specdraft.core.verifier import resolve_train_dtype

    import torch
    dtype = a.dtype if a.dtype != "auto" else resolve_train_dtype("auto", "cpu", H)
    print(json.dumps({"compute_dtype": dtype, "threads": torch.get_num_threads(),
                      "bf16_matmul_gflops": matmul_gflops()}), flush=True)
    results = []
    for T in map(int, a.rows.split(",")):
        for steps in map(int, a.steps.split(",")):
            results.append(run(T, steps, dtype))
            print(json.dumps(results[-1]), flush=True)
    if a.full_ttt:
        T = int(a.rows.split(",")[0])
        results.append(run(T, a.full_ttt, dtype))
        print(json.dumps(results[-1]), flush=True)
    trainable = next(r["trainable"] for r in results if "trainable" in r)
    print(json.dumps({"trainable_params": trainable,
                      "weights_grads_adam_gb": round(16 * trainable / GB, 2),
                      "frozen_embedding_gb_fp32": round(V_KIMI * H * 4 / GB, 2)}))


if __name__ == "__main__":
    main()
