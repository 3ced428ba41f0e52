"""Offline speculative decoding with a DFlash drafter: the :class:`~specdraft.eval.specdec.Drafter`
over :class:`~specdraft.models.dflash.DFlashDraftModel`, run by the same loop as EAGLE-3
(:func:`specdraft.eval.specdec.generate`: the same verifier session, acceptance and commit rules).

The invariant of :mod:`specdraft.eval.specdec` (``L`` committed tokens, the verifier's states
known at positions ``0..L-2``) is exactly what vLLM's DFlash proposer sees: its draft KV cache
holds the context K/V of every committed token but the last (``v1/spec_decode/dflash.py``
``set_inputs_first_pass``: the context is the tokens the verifier just ran, rejected ones
excluded; earlier context stays cached), and the last committed token is the block's anchor at
position ``L - 1``. Here the context states are kept as the verifier's concatenated layer
outputs and the block is recomputed from them at each step (the same values vLLM caches).
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import torch

from specdraft.core.errors import ConfigError
from specdraft.eval.specdec import Generation, VerifierSession, generate
from specdraft.models.dflash import DFlashDraftModel, draft_block


class DFlashDrafter:
    """:class:`~specdraft.eval.specdec.Drafter` of a DFlash model (greedy drafting only)."""

    def __init__(self, model: DFlashDraftModel) -> None:
        self.model = model
        width = model.config.n_target * model.config.target_hidden_size
        self.feats = torch.empty(0, width)  # [T, n*Ht] context states, positions 0..T-1
        self.proposed: list[list[int]] = []  # every block's drafts, in order (what vLLM drafted)

    def observe(self, start: int, feats: torch.Tensor, tokens: torch.Tensor) -> None:
        """Keep the context states of positions ``< start``, then append ``feats`` [m, n*Ht] at
        ``start..start+m-1`` (``tokens``, the next tokens, are not needed: the block reads the
        anchor from the committed ids)."""
        self.feats = torch.cat([self.feats[:start], feats.float().cpu()])

    def propose(self, context: torch.Tensor, k: int, temperature: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, None]:
        """k greedy drafts for committed ids ``context`` [L] (anchor = ``context[-1]``)."""
        if temperature > 0:
            raise ConfigError("the DFlash drafter drafts greedily (vLLM's default "
                              "draft_sample_method); --draft-sample-method probabilistic is "
                              "not implemented for it")
        if len(context) != len(self.feats) + 1:
            raise RuntimeError(f"DFlash drafter: {len(self.feats)} context states for "
                               f"{len(context)} committed tokens (expected one fewer)")
        drafts = draft_block(self.model, self.feats, int(context[-1]), k)
        self.proposed.append(drafts.tolist())
        return drafts, None


class BatchDFlashDrafter:
    """:class:`~specdraft.eval.batch.BatchDrafter` of a DFlash model: each row keeps its context
    states (a :class:`DFlashDrafter`), and one forward drafts every row's block. Rows are
    right-padded to the longest context; row ``b``'s block is anchored at its own length
    ``T_b``, so its queries see columns ``t < T_b`` only
    (:func:`~specdraft.models.dflash.block_mask`) and padding is never attended: the same block as
    :func:`~specdraft.models.dflash.draft_block`
    alone, up to the float reduction order of the batched matmuls."""

    def __init__(self, model: DFlashDraftModel) -> None:
        self.model = model
        self.rows: list[DFlashDrafter] = []

    def single(self) -> DFlashDrafter:
        return DFlashDrafter(self.model)

    def add(self, drafter: DFlashDrafter) -> None:
        self.rows.append(drafter)

    def select(self, rows: list[int]) -> None:
        self.rows = [self.rows[i] for i in rows]

    def observe(self, feats: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor) -> None:
        """Append row b's first ``counts[b]`` states of ``feats`` [B, m, n*Ht] to its context."""
        for b, row in enumerate(self.rows):
            n = int(counts[b])
            row.observe(len(row.feats), feats[b, :n], tokens[b, :n])

    @torch.inference_mode()
    def propose(self, contexts: list[torch.Tensor], k: int, temperature: float,
                generators: list[torch.Generator | None]) -> tuple[torch.Tensor, None]:
        """[B, k] greedy drafts, one block per row anchored at its last committed token."""
        if temperature > 0:
            self.rows[0].propose(contexts[0], k, temperature, generators[0])  # its refusal
        lengths = [len(r.feats) for r in self.rows]
        for row, ctx in zip(self.rows, contexts):
            if len(ctx) != len(row.feats) + 1:
                raise RuntimeError(f"DFlash drafter: {len(row.feats)} context states for "
                                   f"{len(ctx)} committed tokens (expected one fewer)")
        m, dev = self.model, self.model.fc.weight.device
        width = m.config.n_target * m.config.target_hidden_size
        hidden = torch.zeros(len(self.rows), max(lengths), width)
        for b, row in enumerate(self.rows):
            hidden[b, :lengths[b]] = row.feats
        ids = torch.tensor([[[int(c[-1])] + [m.config.mask_token_id] * k] for c in contexts],
                           device=dev)  # [B, 1, k+1]
        anchors = torch.tensor(lengths, device=dev)[:, None]  # [B, 1]
        out = m(hidden.to(dev), ids, anchors)  # [B, 1, k+1, H]
        return m.lm_head(out[:, 0, 1:]).float().argmax(-1).cpu(), None  # [B, k]


def decode(verifier, model: DFlashDraftModel, prompts: Sequence[Sequence[int]], *, k: int,
           max_new_tokens: int, eos_ids: Sequence[int] = (),
           drafts: list[list[list[int]]] | None = None) -> list[Generation]:
    """Greedy (temperature 0) speculative decoding of each prompt (token ids) with the HF
    ``verifier`` and ``model``, one prompt at a time; the verifier's states are read at the
    drafter's ``target_layer_ids + 1``
    (:meth:`~specdraft.models.dflash.DFlashConfig.hf_hidden_ids`).
    ``drafts``, when given, receives each prompt's drafts per verify step ([steps][k])."""
    ids = model.config.hf_hidden_ids()
    out = []
    for p in prompts:
        drafter = DFlashDrafter(model)
        out.append(generate(VerifierSession(verifier, ids), drafter, p, k=k,
                            max_new_tokens=max_new_tokens, temperature=0.0, eos_ids=eos_ids))
        if drafts is not None:
            drafts.append(drafter.proposed)
    return out


def decode_offline(config: Any, verifier: Any, model: Any, prompt_ids: list[list[int]],
                   eos: list[int]) -> list[Any]:
    """The DFlash kind's offline decoder (:func:`specdraft.eval.run.decode` for an
    :class:`~specdraft.eval.config.EvalConfig` ``config``): one block of ``k`` mask slots per
    verify step, greedy; ``--batch-size`` prompts per verifier forward as for EAGLE-3
    (:func:`~specdraft.eval.batch.generate_batch`, same tokens and counts). Raises
    :class:`ConfigError` for what vLLM does not serve with DFlash: a tree, a serve-plan sweep,
    temperature > 0 (greedy drafting only, said by the drafter)."""
    from specdraft.eval.batch import BatchVerifier, generate_batch

    if config.tree or config.sweep is not None:
        raise ConfigError("--topk / --num-draft-tokens / --sweep: a DFlash drafter drafts one "
                          "block, a chain of k; vLLM serves no DFlash tree")
    if config.k != model.config.block_size - 1:
        print(f"eval: warning: k = {config.k} but the DFlash drafter was trained for blocks of "
              f"{model.config.block_size} (k = {model.config.block_size - 1}): measured and "
              f"served as asked, with fewer or more mask slots than trained", file=sys.stderr)
    aux = list(model.config.aux_layer_ids)
    gens = [torch.Generator().manual_seed(config.seed + i) for i in range(len(prompt_ids))]
    common = {"k": config.k, "max_new_tokens": config.max_new_tokens,
              "temperature": config.temperature, "eos_ids": eos}
    if config.batch_size > 1:
        return generate_batch(BatchVerifier(verifier, aux), BatchDFlashDrafter(model),
                              prompt_ids, batch_size=config.batch_size, generators=gens,
                              **common)
    return [generate(VerifierSession(verifier, aux), DFlashDrafter(model), ids, generator=g,
                     **common) for ids, g in zip(prompt_ids, gens)]
