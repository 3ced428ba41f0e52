"""Measure the hidden-state probe's statistic on planted verifier changes (issue #39, item 1).

The probe (:func:`specdraft.artifacts.hidden_states.probe_hidden_states`) compares stored
extract rows with a fresh forward of the verifier it is given. This script stores rows of a
reference model (fp32 forward, ``--storage`` rounding, as extract stores them) and recomputes
them with planted copies of it:

- ``same``: the model itself (the noise floor: padding/batch and storage rounding);
- ``bf16 weights``: a true bf16 copy, run in fp32 (the CPU probe); ``bf16 compute``: run in
  bf16 (a GPU probe);
- ``q4-rtn``: every decoder Linear weight rounded to 4 bits, symmetric, groups of 128 along the
  input (64 where 128 does not divide it; GPTQ/AWQ's storage grid, round-to-nearest: a cruder
  rounding than GPTQ's, so an upper bound of its noise);
- ``q8-rtn``: the same at 8 bits;
- ``last+1%``: every parameter of the last decoder layer scaled by 1.01 (a small fine-tune);
- ``last+1% bf16w`` / ``bf16c``: that, stored in bf16, run in fp32 / bf16;
- ``other``: another random init (tiny model only).

For each: per captured layer the mean cosine and the relative error
``||stored - round(fresh)|| / ||stored||`` (fresh rounded through the same storage codec), the
probe's statistic; and ``logp``: the statistic of ``eval --server``'s logprob check
(:mod:`specdraft.eval.served`), the largest per-position mean ``|served - stored|`` over the
copy's top-5 next-token log-probabilities, the stored teacher being ``log_softmax`` of the
stored final state times the head. Usage:
``python benchmarks/probe_calibration.py [--smollm2] [--rows 2]``.
"""

from __future__ import annotations

import argparse
import copy
import math

import torch

from specdraft.core.batching import pad_rows
from specdraft.core.capture import capture_packed, decoder_parts, default_aux_ids
from specdraft.core.storage import CODECS, decode


def rtn(model: torch.nn.Module, bits: int, group: int = 128) -> torch.nn.Module:
    """A copy whose decoder Linear weights are rounded to ``bits`` (symmetric, per group of
    ``group`` input columns, scale = amax / (2^(bits-1) - 1))."""
    out = copy.deepcopy(model)
    qmax = 2 ** (bits - 1) - 1
    _, layers = decoder_parts(out)
    with torch.no_grad():
        for m in layers.modules():
            if isinstance(m, torch.nn.Linear):
                w = m.weight
                g = w.reshape(w.shape[0], -1, math.gcd(group, w.shape[1]))
                scale = g.abs().amax(-1, keepdim=True).clamp_min(1e-12) / qmax
                w.copy_(((g / scale).round().clamp(-qmax - 1, qmax) * scale).reshape(w.shape))
    return out


def scaled_last(model: torch.nn.Module, factor: float = 1.01) -> torch.nn.Module:
    out = copy.deepcopy(model)
    _, layers = decoder_parts(out)
    with torch.no_grad():
        for p in layers[-1].parameters():
            p.mul_(factor)
    return out


def bf16_weights(model: torch.nn.Module) -> torch.nn.Module:
    """A true bf16 copy run in fp32 (as the CPU probe runs it): weights rounded to bf16."""
    return copy.deepcopy(model).to(torch.bfloat16).to(torch.float32)


def states(model: torch.nn.Module, rows: list[list[int]], aux: tuple[int, ...], codec: str
           ) -> list[torch.Tensor]:
    """Per row ``[T, n_aux + 1, H]`` (aux ids, then the final state at every position), each
    rounded through ``codec`` and decoded to fp32."""
    out = []
    H = model.config.hidden_size
    for r in rows:
        padded = pad_rows([r], [[1] * len(r)])
        with torch.no_grad():
            p = capture_packed(model, padded, aux, CODECS[codec])
        a = decode(p.aux[0], p.aux[1], len(aux)).view(-1, len(aux), H)
        f = decode(p.final[0], p.final[1], 1).view(-1, 1, H)
        out.append(torch.cat([a[:f.shape[0]], f], dim=1))
    return out


def statistics(stored: list[torch.Tensor], fresh: list[torch.Tensor]) -> dict[str, list[float]]:
    s, f = torch.cat(stored).double(), torch.cat(fresh).double()
    cos = torch.nn.functional.cosine_similarity(s, f, dim=-1).mean(0)
    rel = (s - f).norm(dim=(0, 2)) / s.norm(dim=(0, 2))
    return {"cos": cos.tolist(), "rel": rel.tolist()}


def logprob_diff(model: torch.nn.Module, copy_: torch.nn.Module, stored: list[torch.Tensor],
                 rows: list[list[int]], k: int = 5) -> tuple[float, float, float]:
    """Per position, the mean |copy's top-k log-probability - the stored teacher's| (nats):
    its mean over the positions and its largest; and the share of positions whose top token
    is the teacher's."""
    head = model.get_output_embeddings().weight.detach().double()
    diffs, agree = [], []
    for st, r in zip(stored, rows):
        teacher = torch.log_softmax(st[:, -1].double() @ head.T, dim=-1)  # [T, V]
        with torch.no_grad():
            logits = copy_(torch.tensor([r])).logits[0, :-1].double()  # positions 0..T-2
        served = torch.log_softmax(logits, dim=-1)
        top = served.topk(k, dim=-1)
        diffs.append((top.values - teacher.gather(-1, top.indices)).abs().mean(-1))
        agree.append((top.indices[:, 0] == teacher.argmax(-1)).double())
    d = torch.cat(diffs)
    return float(d.mean()), float(d.max()), float(torch.cat(agree).mean())


def tiny(seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    c = LlamaConfig(vocab_size=2000, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    tie_word_embeddings=False)
    return LlamaForCausalLM(c).eval()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", action="store_true", help="the shipped SmolLM2 (GGUF→HF)")
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--storage", default="bf16")
    args = ap.parse_args()
    if args.smollm2:
        from specdraft.core.verifier import load_tokenizer, load_verifier

        model = load_verifier("smollm2", dtype="float32")
        tok = load_tokenizer("smollm2")
        texts = ["Natalia sold clips to 48 of her friends in April, and then she sold half as "
                 "many clips in May. How many clips did Natalia sell altogether?",
                 "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n# print"]
        rows = [tok.encode(t) for t in texts[:args.rows]]
        others = {}
    else:
        model = tiny(0)
        g = torch.Generator().manual_seed(0)
        rows = [torch.randint(0, 2000, (n,), generator=g).tolist() for n in (24, 30)][:args.rows]
        others = {"other": tiny(1)}
    aux = default_aux_ids(len(decoder_parts(model)[1]))
    stored = states(model, rows, aux, args.storage)
    last = scaled_last(model)
    cases = {"same": model, "bf16 weights": bf16_weights(model),
             "bf16 compute": copy.deepcopy(model).to(torch.bfloat16),
             "q8-rtn": rtn(model, 8), "q4-rtn": rtn(model, 4), "last+1%": last,
             "last+1% bf16w": bf16_weights(last),
             "last+1% bf16c": copy.deepcopy(last).to(torch.bfloat16), **others}
    print(f"aux ids {list(aux)} + final; storage {args.storage}; rows "
          f"{[len(r) for r in rows]}")
    for name, m in cases.items():
        st = statistics(stored, states(m, rows, aux, args.storage))
        cos = " ".join(f"{c:.6f}" for c in st["cos"])
        rel = " ".join(f"{r:.2e}" for r in st["rel"])
        mean, worst, top1 = logprob_diff(model, m, stored, rows)
        print(f"{name:>14}: cos [{cos}]  rel [{rel}]  logp mean {mean:.3g} max {worst:.3g} "
              f"top-1 {top1:.2f}")


if __name__ == "__main__":
    main()
