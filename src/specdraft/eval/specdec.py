"""Offline chain speculative decoding: verifier in ``transformers``, EAGLE-3 drafter, both
KV-cached.

One prompt, batch size 1. Invariant at the top of each iteration, with ``L`` tokens committed
(prompt + generated, ``x_0..x_{L-1}``):

- the verifier's ``DynamicCache`` holds positions ``0..L-2`` (the last committed token is not yet
  fed: it is the first input of the next verify forward);
- the drafter's :class:`~specdraft.models.eagle3.DraftKVCache` holds one column per pair
  ``(h_t, x_{t+1})``, ``t = 0..L-2``: ``h_t`` = the verifier's aux hidden states at position
  ``t`` (HF ``hidden_states[i]`` for the drafter's aux ids, fused by ``fc``), ``x_{t+1}`` the
  next committed token; column ``t`` has rotary position ``t``.

A step: the drafter proposes ``d_1..d_k`` (its last column predicts ``d_1``; each further draft
feeds back its own pre-norm output with the drafted token, one position later — the draft
columns are temporary); the verifier runs ``[x_{L-1}, d_1..d_k]`` in one forward (logits
``p_0..p_k`` and aux states); the accepted prefix ``n`` and one verifier token are committed;
the verifier cache is cropped to ``L + n`` (keeping ``x_{L-1}, d_1..d_n``), the drafter cache to
``L - 1`` and then fed the ``n + 1`` new pairs with the verifier's real features.

Acceptance (:func:`verify_step`), named by :func:`acceptance_rule`:

- temperature 0: ``d_j`` is accepted iff it equals the verifier's argmax; the verifier token is
  the argmax after the accepted prefix — the output equals plain greedy decoding.
- temperature T > 0, ``draft_sample_method="greedy"`` (vLLM's default,
  ``vllm/config/speculative.py``; SGLang's only chain rule): ``d_j`` is the drafter's argmax and
  its probability is taken as one-hot, so ``d_j`` is accepted with probability ``p_j(d_j)``
  (``p_j`` = verifier softmax(logits / T)); at the first rejection the verifier token is drawn
  from ``p_j`` with ``d_j`` removed, renormalised (vLLM ``v1/sample/rejection_sampler.py``,
  ``NO_DRAFT_PROBS``: draft probability 1, recovered token from ``p`` masked at the draft).
- temperature T > 0, ``draft_sample_method="probabilistic"``: standard speculative sampling
  (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", Alg. 1;
  Chen et al. 2023, Alg. 2): ``d_j ~ q_j`` (drafter, softmax of its logits / T over the verifier
  vocab, zero outside the draft vocab) is accepted with probability ``min(1, p_j(d_j) /
  q_j(d_j))``; at the first rejection the verifier token is drawn from ``norm(max(0, p_j - q_j))``.

In both sampled rules, after k acceptances the token is drawn from ``p_k``, and the committed
tokens are distributed exactly as sampling the verifier alone at temperature T
(``tests/eval/test_rules.py`` enumerates it). The two differ in acceptance: one step accepts
``p(argmax q)`` in expectation with greedy drafting, ``sum(min(p, q))`` with probabilistic.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch

from specdraft.eval.acceptance import AcceptanceStats, acceptance_rule, commit_tokens
from specdraft.models.eagle3 import DraftKVCache, Eagle3DraftModel


class Drafter(Protocol):
    """What the decoding loop needs from a drafter (the EAGLE-3 one or a test stand-in)."""

    def observe(self, start: int, feats: torch.Tensor, tokens: torch.Tensor) -> None:
        """Feed pairs ``(feats[i], tokens[i])`` at positions ``start + i`` after dropping every
        cached column from ``start`` on. feats [m, n_aux*Ht] float, tokens [m] int64."""

    def propose(self, context: torch.Tensor, k: int, temperature: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """k drafts (verifier-vocab ids, [k] int64) and, for temperature > 0, their proposal
        distributions q over the verifier vocab ([k, V] float32). context: committed ids [L]."""


def pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [V] -> (token [] int64, probs [V] float32 or None when greedy)."""
    if temperature <= 0:
        return logits.argmax(-1), None
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[0], probs


class EagleDrafter:
    """:class:`Drafter` over an :class:`Eagle3DraftModel` with a :class:`DraftKVCache`."""

    def __init__(self, model: Eagle3DraftModel) -> None:
        self.model = model
        self.cache = DraftKVCache()
        self.last: torch.Tensor | None = None  # [1, 1, H] pre-norm output of the last column
        K = model.config.draft_vocab_size
        self.target_ids = model.draft_to_target(torch.arange(K, device=model.d2t.device))  # [K]

    def full_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[..., K] draft-vocab logits -> [..., V] verifier-vocab logits, -inf outside the draft
        vocab (vLLM ``llama_eagle3.py`` ``compute_logits`` does the same scatter)."""
        full = draft_logits.new_full((*draft_logits.shape[:-1], self.model.config.vocab_size),
                                     float("-inf"))
        full[..., self.target_ids] = draft_logits
        return full

    @torch.inference_mode()
    def observe(self, start: int, feats: torch.Tensor, tokens: torch.Tensor) -> None:
        self.cache.crop(start)
        dev = self.model.fc.weight.device
        h = self.model.fuse_aux(feats[None].to(dev))  # [1, m, H]
        pos = torch.arange(start, start + len(tokens), device=dev)[None]  # [1, m]
        out = self.model.forward_cached(tokens[None].to(dev), h, pos, self.cache)  # [1, m, H]
        self.last = out[:, -1:]

    @torch.inference_mode()
    def propose(self, context: torch.Tensor, k: int, temperature: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        h, base = self.last, self.cache.length
        drafts, qs = [], []
        for j in range(k):
            logits = self.full_logits(self.model.logits(h)[0, -1].float())  # [V]
            d, q = pick(logits, temperature, generator)
            drafts.append(d)
            qs.append(q)
            if j < k - 1:
                pos = torch.tensor([[base + j]], device=h.device)
                h = self.model.forward_cached(d.view(1, 1), self.model.feedback(h), pos,
                                               self.cache)  # [1, 1, H] prenorm
        q_all = torch.stack(qs).cpu() if temperature > 0 else None
        return torch.stack(drafts).cpu(), q_all


class VerifierSession:
    """The verifier with a ``transformers`` ``DynamicCache``; returns logits and aux states.

    The cache is built without the model's config, so every layer is a full
    ``DynamicLayer``, even a sliding-window one: ``DynamicSlidingWindowLayer`` drops the keys
    that leave the window, after which a rejected draft cannot be cropped away (transformers
    5.x raises). The window itself is still applied: the model builds its sliding-window mask
    from positions, whatever the cache keeps (output equals greedy without a cache:
    ``tests/eval/test_sliding_window.py``). The cost is memory: the whole sequence is kept.
    """

    def __init__(self, model: Any, aux_ids: Sequence[int]) -> None:
        from transformers import DynamicCache

        self.model = model
        self.aux_ids = list(aux_ids)
        self.cache = DynamicCache()  # full layers, even sliding ones (class doc)
        self.device = model.get_input_embeddings().weight.device

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [m] (the next positions) -> (logits [m, V] float32, aux [m, n_aux*H] float32).

        aux = concat of HF ``hidden_states[i]`` for the drafter's aux ids (the convention of
        ``specdraft.extract``)."""
        with warnings.catch_warnings():
            # transformers 5.x warns that `past_key_values` will be renamed `cache`, yet (5.19)
            # ignores `cache=`: keep the name that works, without the noise.
            warnings.filterwarnings("ignore", "`past_key_values` is deprecated",
                                    FutureWarning)
            out = self.model(input_ids=ids[None].to(self.device), past_key_values=self.cache,
                             use_cache=True, output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i][0] for i in self.aux_ids], dim=-1)  # [m, n_aux*H]
        return out.logits[0].float().cpu(), aux.float().cpu()

    def crop(self, length: int) -> None:
        """Keep positions ``0..length-1`` (``crop`` with a negative count: transformers 5.x)."""
        extra = self.cache.get_seq_length() - length
        if extra > 0:
            self.cache.crop(-extra)


def draft_temperature(temperature: float, draft_sample_method: str) -> float:
    """The temperature the drafter samples at: 0 (its argmax, no q) with greedy drafting."""
    return temperature if draft_sample_method == "probabilistic" else 0.0


def accept_probability(p: torch.Tensor, q: torch.Tensor | None, d: int) -> float:
    """Probability that draft ``d`` is accepted: ``min(1, p(d) / q(d))``, with ``q`` one-hot at
    ``d`` when None (greedy drafting). p, q [V] float32."""
    qd = 1.0 if q is None else float(q[d])
    return min(1.0, float(p[d]) / qd) if qd > 0 else 0.0


def residual(p: torch.Tensor, q: torch.Tensor | None, d: int) -> torch.Tensor:
    """The distribution a rejected draft ``d`` is replaced from: ``norm(max(0, p - q))``, with
    ``q`` one-hot at ``d`` when None (= ``p`` without ``d``); ``p`` itself when that is all zero
    (then the draft was accepted with probability 1). p, q [V] float32 -> [V] float32."""
    if q is None:
        res = p.clone()
        res[d] = 0.0
    else:
        res = (p - q).clamp_min(0)
    total = float(res.sum())
    return res / total if total > 0 else p


def verify_step(logits: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor | None,
                temperature: float, generator: torch.Generator | None) -> tuple[int, int]:
    """Accepted prefix length n and the verifier token (module doc).

    logits [k+1, V] (verifier, at the inputs ``x_{L-1}, d_1..d_k``), drafts [k], q [k, V] with
    probabilistic drafting, None with greedy drafting or at temperature 0.
    """
    k = len(drafts)
    if temperature <= 0:
        target = logits.argmax(-1)  # [k+1]
        n = 0
        while n < k and int(target[n]) == int(drafts[n]):
            n += 1
        return n, int(target[n])
    p = torch.softmax(logits / temperature, dim=-1)  # [k+1, V]
    for j in range(k):
        d, qj = int(drafts[j]), None if q is None else q[j]
        if float(torch.rand((), generator=generator)) < accept_probability(p[j], qj, d):
            continue
        return j, int(torch.multinomial(residual(p[j], qj, d), 1, generator=generator)[0])
    return k, int(torch.multinomial(p[k], 1, generator=generator)[0])


@dataclass
class Generation:
    """One prompt's result: new tokens, per-step acceptance, stop reason, seconds."""

    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    stop: str = "length"
    seconds: float = 0.0

    def commit(self, drafts: list[int], n: int, verifier_token: int, eos_ids: Sequence[int],
               max_new_tokens: int) -> bool:
        """Record one verify step (k = len(drafts), n accepted, then the verifier's token) and
        append what it commits; True when generation is over (an EOS or the length limit)."""
        tokens, stopped = commit_tokens(drafts, n, verifier_token, eos_ids)
        self.stats.add(len(drafts), min(n, len(tokens)), len(tokens),
                       context=self.prompt_tokens + len(self.tokens))
        self.tokens.extend(tokens)
        if stopped:
            self.stop = "eos"
        return self.done(max_new_tokens)

    def done(self, max_new_tokens: int) -> bool:
        """An EOS was committed or ``max_new_tokens`` are reached."""
        return self.stop == "eos" or len(self.tokens) >= max_new_tokens

    def summary(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "new_tokens": len(self.tokens),
                "stop": self.stop, "seconds": round(self.seconds, 4),
                **self.stats.summary()}


def prefill(verifier: VerifierSession, drafter: Drafter, ids: torch.Tensor, *,
            temperature: float, eos_ids: Sequence[int],
            generator: torch.Generator | None) -> Generation:
    """The prompt's forward (ids [P] int64): its first token (not a verify step) and the
    drafter fed the P prompt pairs ``(h_t, x_{t+1})``, the last with the first token."""
    gen = Generation(prompt_tokens=len(ids))
    logits, aux = verifier.forward(ids)
    first = int(pick(logits[-1], temperature, generator)[0])
    drafter.observe(0, aux, torch.cat([ids[1:], torch.tensor([first])]))
    gen.tokens.append(first)
    if first in set(eos_ids):
        gen.stop = "eos"
    return gen


def generate(verifier: VerifierSession, drafter: Drafter, prompt: Sequence[int], *, k: int,
             max_new_tokens: int, temperature: float = 0.0, eos_ids: Sequence[int] = (),
             generator: torch.Generator | None = None,
             draft_sample_method: str = "greedy") -> Generation:
    """Speculatively decode up to ``max_new_tokens`` after ``prompt`` (module doc). The first
    token comes from the prefill and is not a verify step. ``draft_sample_method`` (vLLM's
    names) picks the rule at temperature > 0."""
    acceptance_rule(temperature, draft_sample_method)  # refuses an unknown method
    t0 = time.perf_counter()
    ids = torch.tensor(list(prompt), dtype=torch.long)
    gen = prefill(verifier, drafter, ids, temperature=temperature, eos_ids=eos_ids,
                  generator=generator)
    while not gen.done(max_new_tokens):
        L = len(ids) + len(gen.tokens)
        drafts, q = drafter.propose(torch.cat([ids, torch.tensor(gen.tokens)]), k,
                                    draft_temperature(temperature, draft_sample_method),
                                    generator)
        logits, aux = verifier.forward(torch.cat([torch.tensor(gen.tokens[-1:]), drafts]))
        n, vt = verify_step(logits, drafts, q, temperature, generator)
        if gen.commit(drafts.tolist(), n, vt, eos_ids, max_new_tokens):
            break
        verifier.crop(L + n)
        drafter.observe(L - 1, aux[: n + 1], torch.tensor(drafts.tolist()[:n] + [vt]))
    del gen.tokens[max_new_tokens:]
    gen.seconds = time.perf_counter() - t0
    return gen
