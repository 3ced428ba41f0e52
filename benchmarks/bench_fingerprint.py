"""The verifier fingerprint's cost per GB: the sampled scheme and the full-content hash.

Writes a synthetic safetensors checkpoint (``--gib`` GiB in ``--tensors`` tensors, bf16), then
times :func:`specdraft.core.verifier_identity.weights_fingerprint` with each scheme, from a cold
page cache (the file's pages dropped with ``posix_fadvise(DONTNEED)`` before each run) and warm.
Prints seconds per GiB and per 1,000 tensors, and the extrapolation to a 1T-parameter
checkpoint (about 1 TB and, for a Kimi-K2-shaped MoE, on the order of 10^5 tensors).

    python benchmarks/bench_fingerprint.py --gib 2 --tensors 4096 [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from specdraft.core.verifier_identity import weights_fingerprint


def write_checkpoint(directory: Path, gib: float, tensors: int) -> int:
    """Random bf16 tensors totalling ``gib`` GiB in shards of at most 1 GiB; returns bytes."""
    per = int(gib * 2**30) // tensors // 2  # bf16 elements per tensor
    shard, size, total, n = {}, 0, 0, 0
    for i in range(tensors):
        shard[f"model.layers.{i // 64}.w{i % 64}.weight"] = torch.randn(per).to(torch.bfloat16)
        size += 2 * per
        if size >= 2**30 or i == tensors - 1:
            save_file(shard, str(directory / f"model-{n:05d}.safetensors"))
            total, shard, size, n = total + size, {}, 0, n + 1
    return total


def drop_cache(directory: Path) -> None:
    for f in directory.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(directory: Path, scheme: str, cold: bool) -> tuple[float, int]:
    if cold:
        drop_cache(directory)
    t0 = time.perf_counter()
    fp = weights_fingerprint(directory, scheme=scheme)
    return time.perf_counter() - t0, fp["bytes_read"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--tensors", type=int, default=4096)
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: tmp)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        total = write_checkpoint(d, args.gib, args.tensors)
        gib = total / 2**30
        print(f"checkpoint: {gib:.2f} GiB in {args.tensors} tensors")
        for scheme in ("sampled", "full"):
            for cold in (True, False):
                s, read = timed(d, scheme, cold)
                print(f"{scheme:>7} {'cold' if cold else 'warm'}: {s:7.3f} s, read "
                      f"{read / 2**20:9.1f} MiB, {s / gib:7.3f} s/GiB, "
                      f"{1000 * s / args.tensors:7.3f} s per 1,000 tensors")


if __name__ == "__main__":
    main()
