"""Which index torch.topk / torch.max return among equal values, on this machine's devices.

SGLang ranks EAGLE tree candidates with ``torch.topk`` (``torch.max`` when topk is 1) on CUDA;
PyTorch does not document the order of equal values. specdraft's offline tree eval
(:mod:`specdraft.eval.tree`) breaks ties to the lower index; this script shows what each
device does. Run: ``python benchmarks/topk_ties_cuda.py`` (prints JSON lines).
"""

import json

import torch


def cases():
    yield "small", torch.tensor([0.1, 0.3, 0.3, 0.05, 0.3, 0.1]), 4
    yield "pool_16", torch.tensor([0.5, 0.25, 0.25, 0.5] + [0.125] * 12), 6
    v = torch.zeros(128256)
    v[[7, 1000, 50000, 128000]] = 0.25  # equal probabilities in a vocab-sized row
    yield "vocab_row", v, 4
    g = torch.Generator().manual_seed(0)
    w = torch.randint(0, 4, (200,), generator=g).float()
    yield "many_ties", w, 8


def main() -> None:
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for name, v, k in cases():
        row = {"case": name, "k": k, "torch": torch.__version__}
        for dev in devices:
            x = v.to(dev)
            row[f"{dev}_topk"] = torch.topk(x, k).indices.tolist()
            row[f"{dev}_topk_2d"] = torch.topk(x[None].repeat(3, 1), k, dim=-1).indices[0].tolist()
            row[f"{dev}_max"] = int(torch.max(x[None], dim=-1, keepdim=True).indices)
        row["lower_index_first"] = torch.sort(-v, stable=True).indices[:k].tolist()
        print(json.dumps(row))


if __name__ == "__main__":
    main()
