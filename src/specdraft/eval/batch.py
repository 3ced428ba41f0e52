"""Offline chain speculative decoding of several prompts per verifier forward.

The algorithm, acceptance rule and cache invariant are those of :mod:`specdraft.eval.specdec`
(its module doc); here up to B prompts advance together: one verifier forward checks the k
drafts of every row, one drafter forward per draft position proposes for every row. A row that
finishes (EOS or ``max_new_tokens``) leaves the batch and the next prompt joins it.

Cache layout, shared by the verifier's ``DynamicCache`` layers and the drafter's KV cache:
tensors [B, heads, S, d] with S *slots* common to all rows, and :class:`Slots` ``valid [B, S]``
marking the slots that hold a row's committed positions. A row's slots are in its time order
and its rotary positions are passed explicitly (``position_ids`` = its count of valid slots),
so padding and holes change nothing but the attention mask:

- a prompt joins after its own prefill (batch 1, :func:`specdec.prefill`, bit for bit the
  batch-1 loop's), its slots right-aligned: the shorter side gets invalid slots on the left;
- a verify step appends k+1 slots to every row, and the slots of rejected drafts become holes
  (where the batch-1 loop crops its cache);
- the drafter's temporary draft columns are cut once proposing is done (every row has the same
  slot count); its new pairs are appended right-padded to the longest row's count;
- once holes exceed a quarter of the slots, both caches are compacted (valid slots gathered,
  order kept).

Masked slots hold finite values (zeros, stale keys), so their softmax weight is exactly 0.
Against the batch-1 loop the same tokens enter the same positions and only the float reduction
order of batched kernels differs (~1e-7 in float32): greedy outputs and counts are identical
unless two logits tie within that noise (tested in ``tests/eval/test_batch.py`` and against
vLLM in ``tests/engine``). With temperature > 0 each prompt draws from its own generator in the
same order as alone, so the batch size does not change what is sampled either.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch

from specdraft.core.errors import ConfigError
from specdraft.eval.specdec import (Drafter, EagleDrafter, Generation, VerifierSession,
                                    acceptance_rule, draft_temperature, pick, prefill,
                                    verify_step)
from specdraft.models.eagle3 import DraftKVCache, Eagle3DraftModel


class Slots:
    """Which cache slots hold each row's committed positions: ``valid`` bool [B, S].

    The methods transform lists of cache tensors [B, h, S, d] (any h, d) the same way.
    """

    def __init__(self, valid: torch.Tensor) -> None:
        self.valid = valid

    @property
    def length(self) -> torch.Tensor:
        """[B] int64: committed positions per row (= the next rotary position)."""
        return self.valid.sum(1)

    def join(self, old: list[torch.Tensor], new: list[torch.Tensor],
             new_valid: torch.Tensor) -> list[torch.Tensor]:
        """Append the rows of ``new`` (valid [b, s]) below the current ones; the side with
        fewer slots gets invalid zero slots on the left."""
        S = max(self.valid.shape[1], new_valid.shape[1])
        self.valid = torch.cat([_pad_left(self.valid, S), _pad_left(new_valid, S)])
        return [torch.cat([_pad_left(a, S, dim=2), _pad_left(b, S, dim=2)])
                for a, b in zip(old, new)]

    def select(self, tensors: list[torch.Tensor], rows: list[int]) -> list[torch.Tensor]:
        """Keep ``rows`` (in that order)."""
        if rows == list(range(self.valid.shape[0])):
            return tensors
        idx = torch.tensor(rows, dtype=torch.long)
        self.valid = self.valid[idx]
        return [t[idx.to(t.device)] for t in tensors]

    def compact(self, tensors: list[torch.Tensor], *, slack: float = 0.25
                ) -> list[torch.Tensor]:
        """Gather each row's valid slots, right-aligned, when holes and padding exceed
        ``slack`` of the slots of the longest row; else return ``tensors`` unchanged."""
        B, S = self.valid.shape
        keep = int(self.length.max()) if B else 0
        if S - keep <= slack * S:
            return tensors
        order = torch.argsort(self.valid.to(torch.int8), dim=1, stable=True)[:, S - keep:]
        self.valid = self.valid.gather(1, order)
        out = []
        for t in tensors:
            idx = order.to(t.device)[:, None, :, None].expand(B, t.shape[1], keep, t.shape[3])
            out.append(t.gather(2, idx))
        return out


def _pad_left(t: torch.Tensor, size: int, dim: int = 1) -> torch.Tensor:
    """Zero/False-pad ``t`` on the left of ``dim`` to ``size``."""
    extra = size - t.shape[dim]
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _new_valid(counts: torch.Tensor, m: int) -> torch.Tensor:
    """[B, m] bool: the first ``counts[b]`` of m new slots are valid."""
    return torch.arange(m)[None] < counts[:, None]


class BatchVerifier:
    """The verifier over B rows sharing one padded ``DynamicCache`` (module doc)."""

    def __init__(self, model: Any, aux_ids: Sequence[int]) -> None:
        from transformers import DynamicCache

        self.model = model
        self.aux_ids = list(aux_ids)
        _refuse_sliding_window(model.config)
        self.cache = DynamicCache(config=model.config)  # its layers exist before the first add
        self.slots = Slots(torch.zeros(0, 0, dtype=torch.bool))
        self.device = model.get_input_embeddings().weight.device
        self.step_width = 0

    def session(self) -> VerifierSession:
        """A batch-1 session for a joining prompt's prefill."""
        return VerifierSession(self.model, self.aux_ids)

    def add(self, session: VerifierSession) -> None:
        """Take in a prefilled row's cache."""
        new = _layer_tensors(session.cache)
        valid = torch.ones(1, new[0].shape[2], dtype=torch.bool)
        if self.slots.valid.shape[0] == 0:
            self.slots.valid = valid
            _set_layer_tensors(self.cache, new)
        else:
            _set_layer_tensors(self.cache, self.slots.join(_layer_tensors(self.cache), new, valid))

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [B, m] (each row's next m tokens) -> (logits [B, m, V] float32, aux [B, m,
        n_aux*H] float32), as :meth:`VerifierSession.forward` row by row. The m new slots
        count as committed only once :meth:`accept` says how many."""
        import warnings

        B, m = ids.shape
        pos = self.slots.length[:, None] + torch.arange(m)[None]  # [B, m]
        mask = torch.cat([self.slots.valid, torch.ones(B, m, dtype=torch.bool)], 1)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "`past_key_values` is deprecated", FutureWarning)
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.long().to(
                self.device), position_ids=pos.to(self.device), past_key_values=self.cache,
                use_cache=True, output_hidden_states=True)
        self.step_width = m
        aux = torch.cat([out.hidden_states[i] for i in self.aux_ids], dim=-1)
        return out.logits.float().cpu(), aux.float().cpu()

    def accept(self, counts: torch.Tensor) -> None:
        """Of the last forward's m slots, keep the first ``counts[b]`` per row ([B] int64)."""
        self.slots.valid = torch.cat([self.slots.valid, _new_valid(counts, self.step_width)], 1)

    def select(self, rows: list[int]) -> None:
        """Keep ``rows`` (the others finished), then compact when worth it."""
        tensors = self.slots.select(_layer_tensors(self.cache), rows)
        if rows:
            tensors = self.slots.compact(tensors)
        _set_layer_tensors(self.cache, tensors)


def _refuse_sliding_window(config: Any) -> None:
    """Raise :class:`ConfigError` for a verifier with sliding-window layers (as transformers
    lays out its cache: ``DynamicCache(config=...)``): its window mask is built from slot
    indices, which holes and padding make differ from positions."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    kinds = {type(layer).__name__ for layer in DynamicCache(config=config).layers
             if type(layer) is not DynamicLayer}
    if kinds:
        raise ConfigError(f"--batch-size > 1 needs a verifier whose attention layers are all "
                          f"full; this one has {', '.join(sorted(kinds))}: use --batch-size 1")


def _layer_tensors(cache: Any) -> list[torch.Tensor]:
    """[keys_0, values_0, keys_1, ...] of a ``DynamicCache`` of full-attention layers (sliding
    ones are refused by :func:`_refuse_sliding_window`)."""
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


def _set_layer_tensors(cache: Any, tensors: list[torch.Tensor]) -> None:
    """Write ``[keys_0, values_0, ...]`` back into ``cache`` (initialising empty layers)."""
    for i, layer in enumerate(cache.layers):
        if not layer.is_initialized:
            layer.lazy_initialization(tensors[2 * i], tensors[2 * i + 1])
        layer.keys, layer.values = tensors[2 * i], tensors[2 * i + 1]


class BatchDrafter(Protocol):
    """What the batched loop needs from a drafter (the EAGLE-3 one or a test stand-in)."""

    def single(self) -> Drafter:
        """A batch-1 drafter for a joining prompt's prefill (:func:`specdec.prefill`)."""

    def add(self, drafter: Drafter) -> None:
        """Take in the row that ``drafter`` (from :meth:`single`) prefilled."""

    def select(self, rows: list[int]) -> None:
        """Keep ``rows`` (in that order)."""

    def observe(self, feats: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor) -> None:
        """Feed row b the pairs ``(feats[b, i], tokens[b, i])``, ``i < counts[b]``, at its next
        positions. feats [B, m, n_aux*Ht] float, tokens [B, m] int64, counts [B] int64."""

    def propose(self, contexts: list[torch.Tensor], k: int, temperature: float,
                generators: list[torch.Generator | None]
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """k drafts per row ([B, k] int64, verifier-vocab ids) and for temperature > 0 their
        proposal distributions ([B, k, V] float32). contexts: each row's committed ids."""


class BatchEagleDrafter:
    """:class:`BatchDrafter` over an :class:`Eagle3DraftModel`: one [B, kvh, S, d] cache."""

    def __init__(self, model: Eagle3DraftModel) -> None:
        self.model = model
        self.one = EagleDrafter(model)  # its target_ids and full_logits
        self._empty()

    def _empty(self) -> None:
        self.cache = DraftKVCache()
        self.slots = Slots(torch.zeros(0, 0, dtype=torch.bool))
        self.last: torch.Tensor | None = None  # [B, 1, H] pre-norm output of each last column

    def single(self) -> EagleDrafter:
        return EagleDrafter(self.model)

    def add(self, drafter: EagleDrafter) -> None:
        c = drafter.cache
        valid = torch.ones(1, c.length, dtype=torch.bool)
        if self.last is None:
            self.cache.k, self.cache.v, self.slots.valid, self.last = c.k, c.v, valid, drafter.last
            return
        self.cache.k, self.cache.v = self.slots.join([self.cache.k, self.cache.v],
                                                     [c.k, c.v], valid)
        self.last = torch.cat([self.last, drafter.last])

    def select(self, rows: list[int]) -> None:
        if not rows:
            self._empty()
            return
        k, v = self.slots.select([self.cache.k, self.cache.v], rows)
        self.cache.k, self.cache.v = self.slots.compact([k, v])
        self.last = self.last[torch.tensor(rows, device=self.last.device)]

    def _forward(self, tokens: torch.Tensor, h: torch.Tensor, pos: torch.Tensor,
                 extra: torch.Tensor) -> torch.Tensor:
        """tokens [B, m], h [B, m, H], pos [B, m] -> prenorm [B, m, H]; the m columns are
        appended to the cache (not to ``slots``). ``extra`` bool [B, e]: which cache columns
        after the committed slots (earlier temporary drafts, then the m new ones) are seen."""
        dev = self.model.fc.weight.device
        key_mask = torch.cat([self.slots.valid, extra], 1).to(dev)
        return self.model.forward_cached(tokens.to(dev), h, pos.to(dev), self.cache,
                                         key_mask=key_mask)

    @torch.inference_mode()
    def observe(self, feats: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor) -> None:
        m = tokens.shape[1]
        h = self.model.fuse_aux(feats.to(self.model.fc.weight.device))  # [B, m, H]
        new_valid = _new_valid(counts, m)
        out = self._forward(tokens, h, self.slots.length[:, None] + torch.arange(m), new_valid)
        self.slots.valid = torch.cat([self.slots.valid, new_valid], 1)
        rows = torch.arange(len(counts))
        self.last = out[rows, (counts - 1).to(out.device)][:, None]  # [B, 1, H]

    @torch.inference_mode()
    def propose(self, contexts: list[torch.Tensor], k: int, temperature: float,
                generators: list[torch.Generator | None]
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        h, base, slots = self.last, self.slots.length, self.cache.length
        B = len(base)
        drafts, qs = [], []
        for j in range(k):
            logits = self.one.full_logits(self.model.logits(h)[:, -1].float())  # [B, V]
            d, q = _pick_rows(logits, temperature, generators)
            drafts.append(d)
            qs.append(q)
            if j < k - 1:  # temporary column: earlier drafts and this one are seen
                h = self._forward(d[:, None], self.model.feedback(h), (base + j)[:, None],
                                  torch.ones(B, j + 1, dtype=torch.bool))
        self.cache.crop(slots)
        q_all = torch.stack(qs, 1).cpu() if temperature > 0 else None
        return torch.stack(drafts, 1).cpu(), q_all


def _pick_rows(logits: torch.Tensor, temperature: float,
               generators: list[torch.Generator | None]
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [B, V] -> (tokens [B] int64, probs [B, V] or None), row b drawn with its own
    generator (:func:`specdec.pick`)."""
    if temperature <= 0:
        return logits.argmax(-1), None
    picked = [pick(row, temperature, g) for row, g in zip(logits, generators)]
    return torch.stack([t for t, _ in picked]), torch.stack([p for _, p in picked])


@dataclass
class _Row:
    """A prompt being decoded: its index, ids [P], result so far, generator, start time."""

    index: int
    ids: torch.Tensor
    gen: Generation
    generator: torch.Generator | None
    t0: float

    def context(self) -> torch.Tensor:
        return torch.cat([self.ids, torch.tensor(self.gen.tokens, dtype=torch.long)])


def generate_batch(verifier: BatchVerifier, drafter: BatchDrafter,
                   prompts: Sequence[Sequence[int]], *, batch_size: int, k: int,
                   max_new_tokens: int, temperature: float = 0.0, eos_ids: Sequence[int] = (),
                   generators: Sequence[torch.Generator | None] | None = None,
                   draft_sample_method: str = "greedy") -> list[Generation]:
    """:func:`specdec.generate` for every prompt, ``batch_size`` rows at a time (module doc).

    ``generators[i]`` draws prompt i's samples (temperature > 0). Returns one
    :class:`Generation` per prompt, in order; ``seconds`` is each prompt's time from its
    prefill to its end (rows overlap, so these do not add up to the wall time).
    """
    acceptance_rule(temperature, draft_sample_method)  # refuses an unknown method
    gens = list(generators) if generators is not None else [None] * len(prompts)
    results: list[Generation | None] = [None] * len(prompts)
    waiting = iter(range(len(prompts)))
    rows: list[_Row] = []
    while True:
        while len(rows) < batch_size and (i := next(waiting, None)) is not None:
            row = _start(verifier, drafter, i, prompts[i], gens[i], temperature, eos_ids)
            if row.gen.done(max_new_tokens):
                results[i] = _finish(row, max_new_tokens)
            else:
                rows.append(row)
        if not rows:
            break
        rows = _step(verifier, drafter, rows, results, k=k, max_new_tokens=max_new_tokens,
                     temperature=temperature, eos_ids=eos_ids,
                     draft_sample_method=draft_sample_method)
    return results  # type: ignore[return-value]


def _start(verifier: BatchVerifier, drafter: BatchDrafter, index: int, prompt: Sequence[int],
           generator: torch.Generator | None, temperature: float,
           eos_ids: Sequence[int]) -> _Row:
    """Prefill one prompt alone and, unless it is already done, add it to both caches."""
    t0 = time.perf_counter()
    ids = torch.tensor(list(prompt), dtype=torch.long)
    session, single = verifier.session(), drafter.single()
    gen = prefill(session, single, ids, temperature=temperature, eos_ids=eos_ids,
                  generator=generator)
    row = _Row(index, ids, gen, generator, t0)
    if gen.stop != "eos":
        verifier.add(session)
        drafter.add(single)
    return row


def _step(verifier: BatchVerifier, drafter: BatchDrafter, rows: list[_Row],
          results: list[Generation | None], *, k: int, max_new_tokens: int,
          temperature: float, eos_ids: Sequence[int], draft_sample_method: str) -> list[_Row]:
    """One verify step for every row; finished rows go to ``results``. Returns the rows left."""
    drafts, q = drafter.propose([r.context() for r in rows], k,
                                draft_temperature(temperature, draft_sample_method),
                                [r.generator for r in rows])
    last = torch.tensor([[r.gen.tokens[-1]] for r in rows], dtype=torch.long)
    logits, aux = verifier.forward(torch.cat([last, drafts], 1))  # [B, k+1, V], [B, k+1, A]
    B = len(rows)
    keep, feed = [], torch.zeros(B, k + 1, dtype=torch.long)
    counts = torch.zeros(B, dtype=torch.long)
    for b, r in enumerate(rows):
        n, vt = verify_step(logits[b], drafts[b], None if q is None else q[b], temperature,
                            r.generator)
        if r.gen.commit(drafts[b].tolist(), n, vt, eos_ids, max_new_tokens):
            results[r.index] = _finish(r, max_new_tokens)
            continue
        keep.append(b)
        feed[b, :n], feed[b, n], counts[b] = drafts[b, :n], vt, n + 1
    verifier.accept(counts)  # the batch-1 loop's crop to L + n: x_{L-1}, d_1..d_n stay
    verifier.select(keep)
    drafter.select(keep)
    if keep:
        drafter.observe(aux[keep], feed[keep], counts[keep])
    return [rows[b] for b in keep]


def _finish(row: _Row, max_new_tokens: int) -> Generation:
    del row.gen.tokens[max_new_tokens:]
    row.gen.seconds = time.perf_counter() - row.t0
    return row.gen
