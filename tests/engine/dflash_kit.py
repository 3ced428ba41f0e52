"""Pieces of the DFlash real-engine test: a tiny random Qwen3 verifier vLLM's CPU build serves
(float32, head_dim 32), its greedy answers to a few token-id prompts, and a DFlash drafter
overfit on them with specdraft's DFlash objective."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

#: Block of K + 1 = 5 (anchor + 4 mask slots); 6 prompts of 8 ids, 32 new tokens each.
K, N_PROMPTS, PROMPT_LEN, NEW = 4, 6, 8, 32
MASK_TOKEN_ID = 5  # any id of the vocabulary; its row of the verifier's table embeds every slot
TARGET_LAYER_IDS = (1, 3)  # outputs of layers 1 and 3 of 6 = HF hidden_states[2], [4]


def make_qwen3_verifier(out: Path, tokenizer_dir: Path, *, seed: int = 0, init: float = 0.3):
    """A 6-layer random Qwen3 (hidden 64, 2 heads of 32, 1 kv head) with the SmolLM2 tokenizer,
    saved to ``out``; weight std ``init`` 0.3 makes its greedy answers varied (engine_kit's
    reason). Returns the HF model (float32, eval)."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=32, max_position_embeddings=2048, tie_word_embeddings=False,
                         initializer_range=init, rope_parameters={"rope_type": "default",
                                                                   "rope_theta": 10000.0},
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    model = Qwen3ForCausalLM(config).eval()
    model.save_pretrained(out)
    for f in Path(tokenizer_dir).iterdir():
        shutil.copy(f, out / f.name)
    return model


def prompts(seed: int = 1) -> list[list[int]]:
    """N_PROMPTS prompts of PROMPT_LEN random ids in [1000, 30000) (no special token)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1000, 30000, (N_PROMPTS, PROMPT_LEN), generator=g).tolist()


@torch.no_grad()
def greedy_rows(verifier, prompt_ids: list[list[int]], new: int = NEW):
    """ids [B, P+new] (each prompt and the verifier's greedy answer) and loss_mask [B, P+new]
    (1 on the answer)."""
    ids = verifier.generate(torch.tensor(prompt_ids), do_sample=False, max_new_tokens=new,
                            min_new_tokens=new, pad_token_id=0,
                            attention_mask=torch.ones(len(prompt_ids), len(prompt_ids[0]),
                                                      dtype=torch.long))
    mask = torch.zeros_like(ids)
    mask[:, len(prompt_ids[0]):] = 1
    return ids, mask


@torch.no_grad()
def target_states(verifier, ids: torch.Tensor, hf_ids: list[int]) -> torch.Tensor:
    """[B, T, n*H]: HF ``hidden_states[i]`` for i in ``hf_ids``, concatenated."""
    hs = verifier(input_ids=ids, output_hidden_states=True).hidden_states
    return torch.cat([hs[i] for i in hf_ids], dim=-1).float()


def make_drafter(verifier, *, layers: int = 2, seed: int = 2, norm_spread: float = 0.3):
    """A random DFlash drafter of :data:`K` + 1 slots over ``verifier`` (its tables copied), every
    RMSNorm gain drawn as ``1 + norm_spread·N(0, 1)`` (per layer, per norm): a norm the engine
    skipped, or applied with another layer's gain, then changes what it drafts."""
    from specdraft.models.dflash import DFlashConfig, DFlashDraftModel

    torch.manual_seed(seed)
    config = DFlashConfig.from_verifier(verifier.config, target_layer_ids=TARGET_LAYER_IDS,
                                        mask_token_id=MASK_TOKEN_ID, block_size=K + 1,
                                        num_hidden_layers=layers)
    model = DFlashDraftModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + norm_spread * torch.randn(p.shape))
    model.set_verifier_tables(verifier)
    return model


def edit_export(src: Path, dst: Path, edit) -> Path:
    """A copy of the DFlash export ``src`` at ``dst`` with ``edit(dflash_config)`` applied to its
    ``config.json`` (a planted fault); returns ``dst``."""
    import json

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg["dflash_config"])
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst
