"""Test reimplementations of the vLLM and SGLang EAGLE-3 drafter loading rules (facts read from
the engines' source; no engine code copied). Each rule names the file it mirrors.

Both return ``(params, problems)``: the engine-side parameters they would hold after loading
(``{name: tensor}``), and every missing parameter / unmatched checkpoint name.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

# vllm/model_executor/models/llama_eagle3.py and python/sglang/srt/models/llama_eagle3.py:
# stacked_params_mapping (param_name, shard_name, shard_id)
STACKED = [(".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"),
           (".qkv_proj", ".v_proj", "v"), (".gate_up_proj", ".gate_proj", 0),
           (".gate_up_proj", ".up_proj", 1)]


def _params(cfg: dict, layer: str) -> dict[str, tuple[int, ...]]:
    """Engine-side parameters of a 1-layer Llama EAGLE-3 drafter and their shapes."""
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    # fc input: target_hidden_size * 3 (hidden_size when absent) -- both llama_eagle3.py files
    fc_in = 3 * (cfg.get("target_hidden_size") or H)
    K = cfg.get("draft_vocab_size") or cfg["vocab_size"]
    return {
        f"model.{layer}.self_attn.qkv_proj.weight": (q + 2 * kv, 2 * H),
        f"model.{layer}.self_attn.o_proj.weight": (H, q),
        f"model.{layer}.mlp.gate_up_proj.weight": (2 * I, H),
        f"model.{layer}.mlp.down_proj.weight": (H, I),
        f"model.{layer}.input_layernorm.weight": (H,),
        f"model.{layer}.hidden_norm.weight": (H,),
        f"model.{layer}.post_attention_layernorm.weight": (H,),
        "model.fc.weight": (H, fc_in), "model.norm.weight": (H,),
        "model.embed_tokens.weight": (cfg["vocab_size"], H), "lm_head.weight": (K, H),
    }


def _shard_offsets(cfg: dict, shard) -> tuple[int, int]:
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    I = cfg["intermediate_size"]
    return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv), 0: (0, I), 1: (I, I)}[shard]


def _put(params, filled, cfg, name, tensor, shard, problems):
    if name not in params:
        problems.append(f"no parameter {name}")
        return
    if shard is None:
        if tuple(tensor.shape) != tuple(params[name].shape):
            problems.append(f"{name}: shape {list(tensor.shape)} vs {list(params[name].shape)}")
            return
        params[name] = tensor.clone()
    else:
        start, size = _shard_offsets(cfg, shard)
        if tensor.shape[0] != size or tensor.shape[1:] != params[name].shape[1:]:
            problems.append(f"{name}[{shard}]: shape {list(tensor.shape)}")
            return
        params[name][start:start + size] = tensor
    filled.add(name)


def _stack(name: str):
    for param_name, shard_name, shard in STACKED:
        if shard_name in name:
            return name.replace(shard_name, param_name), shard
    return name, None


def vllm_load(path: Path):
    """``Eagle3LlamaForCausalLM.load_weights`` + ``LlamaModel.load_weights`` of
    ``vllm/model_executor/models/llama_eagle3.py``: ``t2d`` skipped; ``d2t`` ->
    ``draft_id_to_target_id``; names without ``lm_head`` get ``model.``; ``midlayer.`` ->
    ``layers.0.``; q/k/v and gate/up stacked; ``embed_tokens`` skipped when absent (the
    verifier's is shared); an unknown name is a KeyError in ``params_dict[name]``."""
    cfg = json.loads((path / "config.json").read_text())
    shapes = _params(cfg, "layers.0")
    params = {n: torch.full(s, float("nan")) for n, s in shapes.items()}
    params["draft_id_to_target_id"] = torch.zeros(cfg["draft_vocab_size"], dtype=torch.long)
    filled: set[str] = set()
    problems: list[str] = []
    weights = load_file(str(path / "model.safetensors"))
    for name, t in weights.items():
        if "t2d" in name:
            continue
        if "d2t" in name:
            name = name.replace("d2t", "draft_id_to_target_id")
        elif "lm_head" not in name:
            name = "model." + name
        name = name.replace("midlayer.", "layers.0.")
        name, shard = _stack(name)
        _put(params, filled, cfg, name, t, shard, problems)
    skip = set() if "embed_tokens.weight" in weights else {"model.embed_tokens.weight"}
    problems += [f"missing {n}" for n in params if n not in filled and n not in skip]
    return params, problems


def sglang_load(path: Path):
    """``LlamaForCausalLMEagle3.load_weights`` of ``python/sglang/srt/models/llama_eagle3.py``:
    ``d2t`` -> ``hot_token_id = d2t + arange``; ``t2d`` skipped; stacked names; a name is tried
    as-is then with ``model.``; unmatched names are dropped silently (reported here); the
    embedding is replaced by the verifier's after load (``set_embed_and_head`` path), so it is
    not required."""
    cfg = json.loads((path / "config.json").read_text())
    shapes = _params(cfg, "midlayer")
    params = {n: torch.full(s, float("nan")) for n, s in shapes.items()}
    filled: set[str] = set()
    problems: list[str] = []
    for name, t in load_file(str(path / "model.safetensors")).items():
        if "d2t" in name:
            params["hot_token_id"] = t + torch.arange(t.shape[0])
            filled.add("hot_token_id")
            continue
        if "t2d" in name:
            continue
        name, shard = _stack(name)
        full = name if name in params else f"model.{name}"
        if full not in params:
            problems.append(f"dropped silently: {name}")
            continue
        _put(params, filled, cfg, full, t, shard, problems)
    required = [n for n in params if n != "model.embed_tokens.weight"] + ["hot_token_id"]
    problems += [f"missing {n}" for n in required if n not in filled]
    return params, problems
