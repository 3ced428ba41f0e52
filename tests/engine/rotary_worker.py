"""Run in vLLM's venv by test_rotary_vllm.py: vLLM 0.32's own rotary for each exported draft
config, applied to the test's q/k. argv: in.pt out.json.

Each case: ``cfg`` (an exported config.json), ``q`` [1, h, T, d], ``k`` [1, kvh, T, d], ``pos``
[T], ``rq``/``rk`` (specdraft's rotated q/k). Writes ``{case: {max_dq, max_dk, moved, rotary_dim,
cls}}``: the largest differences to specdraft's, and how far vLLM's rotary moved q at all.
"""

import copy
import json
import sys

import torch


def vllm_rotate(cfg, q, k, pos):
    from transformers import LlamaConfig
    from vllm.model_executor.layers.rotary_embedding import get_rope

    hf = LlamaConfig.from_dict(copy.deepcopy(cfg))  # what vLLM parses config.json into
    rope = get_rope(hf.head_dim, max_position=hf.max_position_embeddings,
                    rope_parameters=hf.rope_parameters, is_neox_style=True, dtype=torch.float32)
    _, h, T, d = q.shape
    flat_q = q[0].transpose(0, 1).reshape(T, -1).clone()
    flat_k = k[0].transpose(0, 1).reshape(T, -1).clone()
    vq, vk = rope.forward_native(pos, flat_q, flat_k)
    back = lambda x, n: x.view(T, n, d).transpose(0, 1).unsqueeze(0)  # noqa: E731
    return back(vq, h), back(vk, k.shape[1]), rope


def main() -> None:
    from vllm.config import VllmConfig, set_current_vllm_config

    cases = torch.load(sys.argv[1])
    out = {}
    with set_current_vllm_config(VllmConfig()):
        for name, c in cases.items():
            vq, vk, rope = vllm_rotate(c["cfg"], c["q"], c["k"], c["pos"])
            out[name] = {"max_dq": (vq - c["rq"]).abs().max().item(),
                         "max_dk": (vk - c["rk"]).abs().max().item(),
                         "moved": (vq - c["q"]).abs().max().item(),
                         "rotary_dim": rope.rotary_dim, "cls": type(rope).__name__}
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
