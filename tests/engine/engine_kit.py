"""Drafter variants for the engine tests: the other export formats, and planted faults made by
editing a good export on disk (our export refuses to write them)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS, CONFIG = "model.safetensors", "config.json"

#: Prompts the drafter memorises (ids q0..q5): the verifier's own greedy answers are its data.
QUESTIONS = ["What is 2+2?", "Name a colour.", "Write a haiku about rain.", "Say hello.",
             "Count to five.", "What is the capital of France?"]
K, MAX_TOKENS = 3, 32
#: Training steps/lr to memorise the 6 answers: 30 steps reached position-1 acceptance 0.91
#: (τ 2.71 of 4) offline; 40 give a margin over the gate (~100-140 s on 2 busy CPU cores).
TRAIN = {"max_steps": 40, "lr": 1e-2}


def write_prompts(path: Path, questions: list[str], start: int = 0) -> Path:
    path.write_text("".join(json.dumps({"id": f"q{start + i}", "question": q}) + "\n"
                            for i, q in enumerate(questions)))
    return path


def copy_export(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(export: Path, edit) -> Path:
    path = export / CONFIG
    cfg = json.loads(path.read_text())
    edit(cfg)
    path.write_text(json.dumps(cfg, indent=2))
    return export


def shift_aux(export: Path, by: int) -> Path:
    """Every aux id written (top level and ``eagle_config``) shifted by ``by``: on a ``vllm``
    export both vLLM and our reader then capture the shifted layers (offline = engine)."""
    def edit(cfg):
        for where in (cfg, cfg.get("eagle_config") or {}):
            if "eagle_aux_hidden_state_layer_ids" in where:
                where["eagle_aux_hidden_state_layer_ids"] = [
                    i + by for i in where["eagle_aux_hidden_state_layer_ids"]]
    return edit_config(export, edit)


def drop_top_level_aux(export: Path) -> Path:
    """No top-level ids: vLLM then falls back to the ``eagle_config`` (SGLang-convention) ones."""
    return edit_config(export, lambda cfg: cfg.pop("eagle_aux_hidden_state_layer_ids"))


def shuffle_d2t(export: Path, seed: int = 0) -> Path:
    """Permute the draft -> target map (d2t holds offsets: target = i + d2t[i])."""
    tensors = load_file(str(export / WEIGHTS))
    d2t = tensors["d2t"]
    idx = torch.arange(len(d2t), dtype=d2t.dtype)
    target = idx + d2t
    perm = torch.randperm(len(d2t), generator=torch.Generator().manual_seed(seed))
    tensors["d2t"] = (target[perm] - idx).contiguous()
    save_file(tensors, str(export / WEIGHTS), metadata={"format": "pt"})
    return export


def make_chaotic_verifier(out: Path, tokenizer_dir: Path, *, init: float = 0.3,
                          seed: int = 3) -> Path:
    """An 8-layer random Llama (hidden 64, 2 heads: head_dim 32, the smallest vLLM's CPU
    attention supports) with the SmolLM2 tokenizer. ``init`` (weight std) 0.3 instead of the
    usual 0.02: a 0.02 model answers every prompt with one repeated token (any drafter then
    "accepts"), a 0.3 one with 32 distinct tokens per 32 — something to memorise."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=8, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=2048, tie_word_embeddings=False,
                         initializer_range=init, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(config).eval().save_pretrained(out)
    for f in Path(tokenizer_dir).iterdir():
        shutil.copy(f, out / f.name)
    return out


def make_bigram_verifier(out: Path, tokenizer_dir: Path, *, support: int = 256,
                         spread: float = 3.0, seed: int = 5) -> Path:
    """An 8-layer Llama (hidden 64, head_dim 32, the SmolLM2 tokenizer) that is exactly a
    *bigram* model with moderate entropy: something a drafter can learn everywhere, so that at
    temperature 1 a sampled path does not leave what it learnt (a chaotic verifier's sampled
    answers do, and then nothing is accepted: the module comment of ``test_vllm_sampled``).

    Every attention ``o_proj`` and MLP ``down_proj`` is zero, so the residual stream is the
    token's embedding at every layer and the logits are ``lm_head(norm(embed(x_t)))``. Each
    embedding is ``[1, 3·u_x]`` with ``u_x`` a random unit vector, so every row has the same RMS
    and the normed first coordinate is the same constant for all tokens: ``lm_head``'s first
    column is then a bias, -20 outside ``support`` tokens (ids 1000 .. 1000+support, no special
    token, so no answer stops early) and 0 inside. Inside, the logits are Gaussian with standard
    deviation ``spread``: spread 3 over 256 tokens gives a mean top probability of 0.37 (entropy
    2.6 nats), far from both one-hot and uniform."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    V, H, r = len(tok), 64, 3.0
    config = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=8,
                         num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=2048, tie_word_embeddings=False,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        u = torch.randn(V, H - 1, generator=g)
        u = u / u.norm(dim=-1, keepdim=True)
        model.model.embed_tokens.weight.copy_(torch.cat([torch.ones(V, 1), r * u], dim=1))
        normed = (H / (1 + r * r)) ** 0.5  # RMSNorm's factor on every row
        head = torch.zeros(V, H)
        head[:, 0] = -20.0
        inside = torch.arange(1000, 1000 + support)
        head[inside, 0] = 0.0
        head[inside, 1:] = torch.randn(support, H - 1, generator=g) * (spread / (normed * r))
        model.lm_head.weight.copy_(head)
    model.save_pretrained(out)
    for f in Path(tokenizer_dir).iterdir():
        shutil.copy(f, out / f.name)
    return out


def offline_greedy(verifier, export: Path, prompts: list[list[int]], k: int, max_new: int):
    """``(summary, tokens)``: the offline loop (``specdraft.eval.run.decode``, greedy, batch 1)
    on ``export`` read back as eval reads it: the acceptance summary over ``prompts`` and each
    prompt's committed tokens."""
    from types import SimpleNamespace

    from specdraft.artifacts.drafter import build_model, read_drafter
    from specdraft.eval.acceptance import AcceptanceStats
    from specdraft.eval.run import decode

    model = build_model(read_drafter(export))
    cfg = SimpleNamespace(k=k, max_new_tokens=max_new, temperature=0.0, seed=0, batch_size=1,
                          tree=False, draft_sample_method="greedy")
    gens = decode(cfg, verifier, model, prompts, [])
    stats = AcceptanceStats()
    for g in gens:
        stats.extend(g.stats)
    return stats.summary(), [list(g.tokens) for g in gens]


def wait_until_serving(proc, url: str, log_path: Path, *, limit_s: float = 400) -> None:
    """Wait until the OpenAI server ``proc`` (started in its own session) answers
    ``url/v1/models``; fail the test with its log's tail when it exits, or past ``limit_s``."""
    import time

    import httpx
    import pytest

    deadline = time.monotonic() + limit_s
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the server exited: {log_path.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"the server did not come up: {log_path}"
        time.sleep(1)
