"""An in-memory hidden-state source with the interface of ``specdraft.artifacts.hidden_states``, computed
from a real (tiny, random) HF Llama with ``output_hidden_states=True``, and a synthetic
self-distilled corpus: greedy continuations of the same verifier (repetitive, as random tiny
models fall into loops), so the data tokens are the verifier's greedy tokens."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

VOCAB = 1024
SHARPEN = 30.0


def tiny_llama(seed: int = 0):
    """The train tests' verifier: a random Llama (vocab 1024, hidden 64, 4 layers) whose
    ``lm_head`` is scaled by ``SHARPEN``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a peaked (confident) teacher, as trained verifiers are
        model.lm_head.weight.mul_(SHARPEN)
    return model


@dataclass(frozen=True)
class Row:
    key: str
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux_hidden: torch.Tensor
    final_hidden: torch.Tensor
    target_positions: torch.Tensor


class MemorySource:
    """Rows computed once: aux = cat(hidden_states[i] for i in aux ids), final = hidden_states[N]
    (after the final norm) at the positions p with loss_mask[p+1] == 1."""

    def __init__(self, model, samples: list[tuple[str, list[int], list[int]]],
                 aux_layer_ids=(1, 2, 3)) -> None:
        self.aux_layer_ids = tuple(aux_layer_ids)
        self.hidden_size = model.config.hidden_size
        self.rows = [self._row(model, *s) for s in samples]

    @torch.no_grad()
    def _row(self, model, key, ids, mask) -> Row:
        ids_t = torch.tensor(ids, dtype=torch.long)
        mask_t = torch.tensor(mask, dtype=torch.uint8)
        hs = model(ids_t[None], output_hidden_states=True).hidden_states
        aux = torch.cat([hs[i][0] for i in self.aux_layer_ids], dim=-1).float()
        pos = torch.nonzero(mask_t[1:] == 1).flatten()
        return Row(key, ids_t, mask_t, aux, hs[-1][0, pos].float(), pos)

    def __len__(self) -> int:
        return len(self.rows)

    def keys(self) -> list[str]:
        return [r.key for r in self.rows]

    def get_batch(self, indices) -> list[Row]:
        return [self.rows[i] for i in indices]


@torch.no_grad()
def greedy_corpus(model, n: int, prompt_len: int = 6, gen_len: int = 30, seed: int = 0,
                  vocab_range: int = 2000) -> list[tuple[str, list[int], list[int]]]:
    """``n`` samples: a random prompt then the verifier's greedy continuation (loss-masked)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab_range, (n, prompt_len), generator=g)
    ids = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                         max_new_tokens=gen_len, min_new_tokens=gen_len, pad_token_id=0)
    out = [(f"s{i}/0", ids[i].tolist(), [0] * prompt_len + [1] * gen_len) for i in range(n)]
    return out


def write_vocab(run_dir: Path, samples, vocab_size: int, drop: tuple[int, ...] = ()) -> list[int]:
    """``RUN/vocab``: draft vocab = the loss-masked tokens of ``samples`` (minus ``drop``);
    writes vocab_map.safetensors and a manifest; returns the target ids, ascending."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ (for worker processes)
    from stubs import write_stub_manifest

    ids = sorted({t for _, x, m in samples for t, keep in zip(x, m) if keep} - set(drop))
    draft = torch.tensor(ids, dtype=torch.long)
    d2t = draft - torch.arange(len(ids))
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft] = True
    (run_dir / "vocab").mkdir(parents=True, exist_ok=True)
    save_file({"d2t": d2t, "t2d": t2d}, str(run_dir / "vocab" / "vocab_map.safetensors"))
    write_stub_manifest(run_dir / "vocab", "vocab")
    return ids


def crash_then_resume(run, make_cfg, a, b, kw, *, verifier, source, monkeypatch,
                      crash_at: int = 6) -> dict:
    """Train ``make_cfg(a, **kw)`` uninterrupted, then ``make_cfg(b, **kw)`` killed
    (KeyboardInterrupt) before step ``crash_at`` and resumed with ``resume=True``; returns the
    resumed run's manifest (the caller compares ``a`` and ``b``)."""
    import pytest

    from specdraft.train import loop

    run(make_cfg(a, **kw), verifier=verifier, source=source)
    real = loop.Trainer.train_step

    def crash(self, window):
        if self.step == crash_at:
            raise KeyboardInterrupt("killed")
        return real(self, window)

    monkeypatch.setattr(loop.Trainer, "train_step", crash)
    with pytest.raises(KeyboardInterrupt):
        run(make_cfg(b, **kw), verifier=verifier, source=source)
    monkeypatch.setattr(loop.Trainer, "train_step", real)
    return run(make_cfg(b, resume=True, **kw), verifier=verifier, source=source)
