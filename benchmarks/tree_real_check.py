"""Real-model check of the tree eval: SmolLM2 and a trained drafter (RUN/train/best), 4 demo
prompts, 48 tokens: the tree code at topk 1 against the chain loop (tokens and per-step
counts), and the trees' tokens against the chain's (both greedy), lane and ancestor draft
attention. Usage: ``python benchmarks/tree_real_check.py RUN`` (prints JSON)."""
import json, sys, time
import torch
from specdraft.core.verifier import load_tokenizer, load_verifier
from specdraft.eval.config import EvalConfig
from specdraft.eval.prompts import eval_chat_format, load_prompts, render
from specdraft.eval.run import load_drafter_model
from specdraft.eval.specdec import EagleDrafter, VerifierSession, generate
from specdraft.eval.tree import TreeEagleDrafter, generate_tree, sglang_accept_length
from specdraft.eval.shapes import TreeShape
from specdraft.core.chat import generation_stop_ids

cfg = EvalConfig(run_dir=sys.argv[1], prompts="builtin:demo_eval", limit=8, k=3, out=None)
v = load_verifier("smollm2", dtype="float32")
tok = load_tokenizer("smollm2")
fmt = eval_chat_format(cfg, tok)
prompts = [render(tok, p["messages"], fmt) for p in load_prompts(cfg.prompts, 4)]
eos = generation_stop_ids(v, tok, fmt)
m = load_drafter_model(cfg, v)
aux = m.config.aux_layer_ids
out = {}
chain = [generate(VerifierSession(v, aux), EagleDrafter(m), p, k=3, max_new_tokens=48, eos_ids=eos) for p in prompts]
t1 = [generate_tree(VerifierSession(v, aux), TreeEagleDrafter(m), p, shape=TreeShape(3, 1, 4), max_new_tokens=48, eos_ids=eos) for p in prompts]
st = lambda g: [(s.k, s.accepted, s.committed) for s in g.stats.steps]
out["topk1_equals_chain_tokens"] = all(a.tokens == b.tokens for a, b in zip(chain, t1))
out["topk1_equals_chain_steps"] = all(st(a) == st(b) for a, b in zip(chain, t1))
for shape in [TreeShape(3, 2, 6), TreeShape(5, 4, 8)]:
    for ctx in ["lane", "ancestors"]:
        gs = [generate_tree(VerifierSession(v, aux), TreeEagleDrafter(m, ctx), p, shape=shape, max_new_tokens=48, eos_ids=eos) for p in prompts]
        steps = sum(g.stats.verify_steps for g in gs)
        out[f"{shape.steps}x{shape.topk}x{shape.num_draft_tokens} {ctx}"] = {
            "tau": sum(g.stats.committed for g in gs) / steps, "sglang": sglang_accept_length(gs),
            "tokens_equal_chain": all(a.tokens == b.tokens for a, b in zip(chain, gs))}
steps = sum(g.stats.verify_steps for g in chain)
out["chain k=3"] = {"tau": sum(g.stats.committed for g in chain) / steps, "sglang": sglang_accept_length(chain)}
print(json.dumps(out, indent=1))
