"""Builders shared by the export, eval and doctor tests: a tiny trained drafter in a fake run dir.

The drafter's shape is copied from a tiny verifier; its embedding is the verifier's (as training
must leave it); the upstream manifests (extract, prepare) are written with the real
``write_manifest``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from specdraft.core.config import StageConfig
from specdraft.core.manifest import StageClock, write_manifest
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel
from specdraft.models.io import save_drafter


class FakeStage(StageConfig):
    """Stand-in config of an upstream stage (only its manifest is needed)."""

    verifier: str = "tiny"


def vocab_map(target_ids: list[int], V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [K] int64, t2d [V] bool) for sorted target ids."""
    ids = torch.tensor(sorted(target_ids), dtype=torch.long)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(len(ids)), t2d


def draft_ids(V: int, eos: int, K: int = 64) -> list[int]:
    """K target ids: EOS plus the smallest other ids."""
    others = [i for i in range(K + 1) if i != eos][:K - 1]
    return sorted([eos] + others)


def make_drafter(verifier, *, aux=(2, 3, 4), K: int = 64, seed: int = 0,
                 **overrides) -> Eagle3DraftModel:
    """A random drafter shaped after ``verifier`` (an HF model), embedding copied from it."""
    torch.manual_seed(seed)
    V = verifier.config.vocab_size
    c = Eagle3Config.from_verifier(verifier.config, draft_vocab_size=K, aux_layer_ids=aux,
                                   **overrides)
    m = Eagle3DraftModel(c)
    eos = int(verifier.config.eos_token_id)
    d2t, t2d = vocab_map(draft_ids(V, eos, K), V)
    m.d2t.copy_(d2t)
    m.t2d.copy_(t2d)
    with torch.no_grad():
        m.embed_tokens.weight.copy_(verifier.get_input_embeddings().weight)
    return m


def make_run(run: Path, verifier, drafter: Eagle3DraftModel, *, extract_aux=None,
             template_hash: str | None = None, write_head: bool = True) -> Path:
    """RUN/extract (manifest + verifier head), RUN/prepare (manifest), RUN/train/best."""
    clock = StageClock()
    ids = list(extract_aux if extract_aux is not None else drafter.config.aux_layer_ids)
    ex = run / "extract"
    ex.mkdir(parents=True, exist_ok=True)
    if write_head:
        save_file({"embed_tokens.weight": verifier.get_input_embeddings().weight.detach().clone(),
                   "lm_head.weight": verifier.lm_head.weight.detach().clone()},
                  str(ex / "verifier_head.safetensors"))
    write_manifest(ex, stage="extract", config=FakeStage(), clock=clock,
                   extra={"aux_layer_ids": ids, "n_layers": verifier.config.num_hidden_layers,
                          "hidden_size": verifier.config.hidden_size,
                          "vocab_size": verifier.config.vocab_size,
                          "storage": {"format": "bf16"}})
    if template_hash is not None:
        (run / "prepare").mkdir(parents=True, exist_ok=True)
        write_chat_format(run, template_hash=template_hash)
        write_manifest(run / "prepare", stage="prepare", config=FakeStage(), clock=clock,
                       extra={"verifier_vocab_size": verifier.config.vocab_size,
                              "tokenizer": {}, "chat_format": {}, "forced_token_ids": {}})
    save_drafter(drafter, run / "train" / "best")
    write_manifest(run / "train", stage="train", config=FakeStage(), clock=clock,
                   extra={"steps": 1, "drafter_config": drafter.config.to_dict()})
    return run


def write_chat_format(run: Path, *, template_hash: str, think=None) -> None:
    """RUN/prepare/chat_format.json recording ``template_hash`` (and ``think`` markers)."""
    from specdraft.core.chat import ChatFormat

    ChatFormat(template="(test)", template_sha256=template_hash, template_source="tokenizer",
               stop_token_ids=[2], stop_tokens=["<|im_end|>"], think=think).save(run / "prepare")
