"""Real-model check of the tree eval (:mod:`specdraft.eval.tree`) on SmolLM2 and a trained drafter.

Decodes 4 demo prompts, 48 new tokens, greedy: the chain loop with k = 3, the tree code at
``topk 1`` (must give the chain's tokens and per-step counts exactly) and trees 3x2x6 and 5x4x8
with lane and ancestor draft attention (must commit the chain's tokens). Prints JSON.

Usage: ``python benchmarks/tree_real_check.py RUN`` (RUN has ``train/best``).
"""

from __future__ import annotations

import json
import sys

from specdraft.core.chat import generation_stop_ids
from specdraft.core.verifier import load_tokenizer, load_verifier
from specdraft.eval.config import EvalConfig
from specdraft.eval.prompts import eval_chat_format, load_prompts, render
from specdraft.eval.run import load_drafter_model
from specdraft.eval.shapes import TreeShape
from specdraft.eval.specdec import EagleDrafter, VerifierSession, generate
from specdraft.eval.tree import TreeEagleDrafter, generate_tree, sglang_accept_length

NEW_TOKENS = 48


def steps(g) -> list[tuple[int, int, int]]:
    return [(s.k, s.accepted, s.committed) for s in g.stats.steps]


def figures(gens) -> dict:
    n = sum(g.stats.verify_steps for g in gens)
    return {"tau": sum(g.stats.committed for g in gens) / n,
            "sglang_accept_length": sglang_accept_length(gens)}


def main(run_dir: str) -> None:
    cfg = EvalConfig(run_dir=run_dir, prompts="builtin:demo_eval", k=3)
    verifier, tok = load_verifier("smollm2", dtype="float32"), load_tokenizer("smollm2")
    fmt = eval_chat_format(cfg, tok)
    prompts = [render(tok, p["messages"], fmt) for p in load_prompts(cfg.prompts, 4)]
    eos = generation_stop_ids(verifier, tok, fmt)
    model = load_drafter_model(cfg, verifier)
    aux = model.config.aux_layer_ids

    def tree(shape, context="lane"):
        return [generate_tree(VerifierSession(verifier, aux), TreeEagleDrafter(model, context),
                              p, shape=shape, max_new_tokens=NEW_TOKENS, eos_ids=eos)
                for p in prompts]

    chain = [generate(VerifierSession(verifier, aux), EagleDrafter(model), p, k=3,
                      max_new_tokens=NEW_TOKENS, eos_ids=eos) for p in prompts]
    top1 = tree(TreeShape(3, 1, 4))
    out = {"chain k=3": figures(chain),
           "topk1_equals_chain_tokens": [g.tokens for g in top1] == [g.tokens for g in chain],
           "topk1_equals_chain_steps": [steps(g) for g in top1] == [steps(g) for g in chain]}
    for shape in (TreeShape(3, 2, 6), TreeShape(5, 4, 8)):
        for context in ("lane", "ancestors"):
            gens = tree(shape, context)
            out[f"{shape.steps}x{shape.topk}x{shape.num_draft_tokens} {context}"] = {
                **figures(gens),
                "tokens_equal_chain": [g.tokens for g in gens] == [g.tokens for g in chain]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
