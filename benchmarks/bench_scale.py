"""Checks of docs/scale.md's formulas at reduced shapes, on CPU.

1. Drafter size at the Kimi-K2.5 shape (hidden 7168, vocab 163,840, 64 heads of 128, 8 KV
   heads, intermediate 18,432, draft vocab 32,000 and 163,840): parameters counted on the
   ``meta`` device (no memory), against the formula printed beside them.
2. The teacher at the Kimi vocabulary: peak memory of ``artifacts.batches.verifier_targets`` over
   V = 163,840 for N supervised positions, measured (peak RSS of a fresh subprocess) against
   ``chunk·V·4`` (the [chunk, V] fp32 logits; chunk = min(N, 1024)) plus ``2·chunk·K·4`` (the
   gathered and softmaxed [chunk, K]) plus the ``N·K·4`` result: the full ``N·V·4`` is never
   held, so T = 2048 does not cost 1.3 GB. H is reduced (``--hidden``) to keep the head small;
   the head is an input of its own size ``V·H·4``, allocated before the measurement, as are its
   draft rows ``K·H·4`` (the collator gathers them once).
3. The teacher's time in the epochs after the first, where the collator has the rows' argmax
   cached and skips the ``[N, H] x [H, V]`` logits: the same call timed without and with
   ``argmax``, side by side in one process (one thread), and their ratio.

Usage: ``python benchmarks/bench_scale.py [--hidden 512] [--rows 256,2048] [--draft-vocab 32000]``
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

V_KIMI, H_KIMI = 163_840, 7168
MB = 1e6


def drafter_params(K: int) -> dict[str, int]:
    """Parameter counts of an EAGLE-3 drafter at the Kimi-K2.5 shape (meta device)."""
    import torch

    from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel

    c = Eagle3Config(hidden_size=H_KIMI, num_attention_heads=64, num_key_value_heads=8,
                     head_dim=128, intermediate_size=18_432, rms_norm_eps=1e-6,
                     rope_theta=50_000.0, max_position_embeddings=262_144, vocab_size=V_KIMI,
                     draft_vocab_size=K, target_hidden_size=H_KIMI, aux_layer_ids=(2, 30, 58))
    with torch.device("meta"):
        m = Eagle3DraftModel(c)
    groups = {"embed_tokens (frozen)": "embed_tokens.", "fc": "fc.", "midlayer": "midlayer.",
              "lm_head": "lm_head.", "norm": "norm."}
    out = {name: sum(p.numel() for n, p in m.named_parameters() if n.startswith(pre))
           for name, pre in groups.items()}
    out["total"] = sum(out.values())
    return out


def teacher_child(H: int, N: int, K: int) -> None:
    """In a fresh process: allocate the inputs, then report the peak RSS growth of one
    ``verifier_targets`` call (bytes)."""
    import torch

    from specdraft.artifacts.batches import verifier_targets

    torch.set_num_threads(1)
    head = torch.randn(V_KIMI, H)
    final = torch.randn(N, H)
    draft_ids = torch.randperm(V_KIMI)[:K].sort().values
    t2d = torch.full((V_KIMI,), -1, dtype=torch.long)
    t2d[draft_ids] = torch.arange(K)
    rows = head[draft_ids]  # [K, H]: Collator.draft_head
    verifier_targets(final[:8], head, draft_ids, t2d, draft_head=rows)  # warm-up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    probs, _, top = verifier_targets(final, head, draft_ids, t2d, draft_head=rows,
                                     with_argmax=True)
    first_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    again, _ = verifier_targets(final, head, draft_ids, t2d, draft_head=rows, argmax=top)
    cached_s = time.perf_counter() - t0
    assert torch.equal(probs, again)
    print(json.dumps({"peak_growth": after - before, "probs": probs.numel() * 4,
                      "first_s": first_s, "cached_s": cached_s}))


def teacher_child_run(H: int, N: int, K: int) -> dict:
    """:func:`teacher_child` in a fresh subprocess: ``peak_growth`` (bytes), ``first_s`` and
    ``cached_s`` (s, one call without and with the cached argmax)."""
    out = subprocess.run([sys.executable, __file__, "--child", f"{H},{N},{K}"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--rows", default="256,2048")
    ap.add_argument("--draft-vocab", type=int, default=32_000)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        teacher_child(*map(int, args.child.split(",")))
        return
    for K in (32_000, V_KIMI):
        p = drafter_params(K)
        trainable = p["total"] - p["embed_tokens (frozen)"]
        print(f"drafter at the Kimi-K2.5 shape, draft vocab {K}: " + ", ".join(
            f"{k} {v / 1e9:.3f}B" for k, v in p.items()) + f"; trainable {trainable / 1e9:.3f}B")
    K, H = args.draft_vocab, args.hidden
    print(f"teacher verifier_targets, V {V_KIMI}, K {K}, H {H} "
          f"(head {V_KIMI * H * 4 / MB:.0f} MB allocated before), chunk 1024:")
    for N in map(int, args.rows.split(",")):
        c = min(N, 1024)
        predicted = c * V_KIMI * 4 + 2 * c * K * 4 + N * K * 4
        got = teacher_child_run(H, N, K)
        print(f"  N {N:5d}: peak growth {got['peak_growth'] / MB:7.0f} MB, formula chunk·V·4 + "
              f"2·chunk·K·4 + N·K·4 = {predicted / MB:7.0f} MB (full N·V·4 would be "
              f"{N * V_KIMI * 4 / MB:.0f} MB); first epoch {got['first_s']:.2f} s, later epochs "
              f"(argmax cached) {got['cached_s']:.2f} s: {got['first_s'] / got['cached_s']:.1f}x")


if __name__ == "__main__":
    main()
