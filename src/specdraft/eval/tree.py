"""Offline EAGLE tree speculative decoding as SGLang serves it, at temperature 0.

SGLang's knobs (``--speculative-num-steps S --speculative-eagle-topk K
--speculative-num-draft-tokens N``) and what one verify step does with them, read from SGLang's
source (``python/sglang/srt/speculative/``: ``eagle_worker.py`` ``draft_forward``,
``spec_utils.py``/``eagle_utils.py`` ``select_top_k_tokens``, ``build_eagle_tree.py``) for the
facts; this code is specdraft's own. It was **not** compared with a running SGLang (none runs on a
CPU machine).

Drafting (:func:`draft_tree`), scores are products of the drafter's probabilities (softmax of its
logits over the draft vocab), float32:

- depth 1: the K most probable tokens of the drafter's last committed column; each becomes a
  *lane* with score = its probability. All K go to the candidate pool.
- depth d = 2..S: each lane is run through the drafter once (its token, the feature of the
  column that proposed it, one position later); its K best children get score = lane score ×
  child probability. All K² children go to the pool (lane-major: lane j's children
  ``j·K .. j·K+K-1``); the K best of them become the next lanes, best first.
- the pool holds ``K + (S-1)·K²`` candidates; the N-1 of highest score are kept and put back in
  pool order (SGLang: ``torch.topk`` then ``torch.sort`` of the indices), which is depth order.
  A child's score never exceeds its parent's, so with ties broken towards the lower pool index
  every kept node's ancestors are kept too.

Ties (:func:`top_indices`): equal values are ranked lower index first. For a chain (K = 1)
that is SGLang's rule: it takes ``torch.max``, which returns the first maximal index
(documented), as ``argmax`` in the chain eval does. For K > 1 SGLang calls ``torch.topk`` on
CUDA, whose order among equal values PyTorch does not document; on CPU (torch 2.13) it is *not*
lower-index-first. It could not be read on a GPU here (none lent);
``benchmarks/topk_ties_cuda.py`` prints it on a machine that has one. Exact ties between
different tokens are rare in float32 softmax; the one that occurs is a child of probability 1.0
scoring exactly its parent, where lower-index-first keeps the parent. Ranking over verifier
ids equals ranking over draft ids: specdraft's draft vocabulary keeps target ids in increasing
order (:mod:`specdraft.vocab.mapping`).

The drafter's attention while drafting (SGLang's draft KV layout, ``assign_draft_cache_locs`` /
``generate_draft_decode_kv_indices``): each lane owns one KV slot per depth and a lane's query
sees the committed context plus *its own lane's* earlier slots. After the K best children are
re-ranked into lanes, lane j's earlier slots belong to whichever node held lane j before, not
necessarily to its parent; the feature input, though, is the parent's output. ``context="lane"``
(default) reproduces that; ``context="ancestors"`` gives every node exactly its ancestors (the
EAGLE papers' tree attention). With K = 1 both are the chain.

Verification (:func:`verify_tree`), greedy: from the root (the last committed token) accept, at
each depth, the child whose token equals the verifier's argmax after the path accepted so far;
the verifier's argmax after the last accepted node is the bonus token. SGLang computes those
argmaxes in one forward over the tree with an ancestor-only mask; here the verifier runs
causally along the accepted path (the first-child chain in one forward, re-run from a node
where another child is accepted), which gives the same argmaxes up to float reduction order
and commits exactly the verifier's greedy continuation.

Accept length: SGLang reports completion tokens / verify forwards, where the prefill's first
token counts as a completion token (``meta_info.completion_tokens`` / ``spec_verify_ct``);
specdraft's τ leaves that token out (:mod:`specdraft.eval.acceptance`). Both are reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, Protocol, Sequence

import torch

from specdraft.eval.shapes import TreeShape
from specdraft.eval.specdec import EagleDrafter, Generation, VerifierSession, prefill


def top_indices(values: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of the ``n`` largest of ``values`` [M], largest first, ties to the lower index
    (module doc). Returns [n] int64."""
    order = torch.sort(-values, stable=True).indices
    return order[:n]


@dataclass
class DraftTree:
    """The N-1 verified draft nodes of one step, in SGLang's order (pool order = depth order).

    ``tokens[i]`` (verifier vocab), ``parents[i]`` (index into these nodes, -1 = the root),
    ``depth[i]`` (1 = a child of the root)."""

    tokens: list[int]
    parents: list[int]
    depth: list[int]

    def children(self, node: int) -> list[int]:
        """Nodes whose parent is ``node`` (-1 = root), in sibling (index) order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    @property
    def max_depth(self) -> int:
        return max(self.depth, default=0)


class TreeDrafter(Protocol):
    """What tree drafting needs from a drafter (the EAGLE-3 one or a hand-written stub)."""

    def observe(self, start: int, feats: torch.Tensor, tokens: torch.Tensor) -> None:
        """As :meth:`specdraft.eval.specdec.Drafter.observe`."""

    def root_probs(self) -> torch.Tensor:
        """The drafter's distribution for depth 1 over the verifier vocab, [V] float32."""

    def lane_probs(self, tokens: torch.Tensor, parent_lanes: torch.Tensor) -> torch.Tensor:
        """Run the lanes of one depth: lane j holds ``tokens[j]``, a child of the previous
        depth's lane ``parent_lanes[j]`` (all 0 at depth 1). Returns the next distributions
        [K, V] float32. Called once per depth 1..S-1, then :meth:`end_tree`."""

    def end_tree(self) -> None:
        """Drop the temporary draft state."""


def draft_tree(drafter: TreeDrafter, shape: TreeShape) -> DraftTree:
    """Draft one step's tree (module doc). Returns the N-1 kept nodes."""
    K = shape.topk
    probs = drafter.root_probs()
    top = top_indices(probs, K)
    scores, tokens = probs[top], top  # [K] the lanes
    pool_scores, pool_tokens, pool_parent = [scores], [tokens], [torch.full((K,), -1)]
    lane_pool = torch.arange(K)  # pool index of each lane's node
    parent_lanes = torch.zeros(K, dtype=torch.long)
    for _ in range(1, shape.steps):
        child_probs = drafter.lane_probs(tokens, parent_lanes)  # [K, V]
        child_top = torch.stack([top_indices(row, K) for row in child_probs])  # [K, K]
        child_scores = scores[:, None] * child_probs.gather(1, child_top)  # [K, K]
        base = sum(len(s) for s in pool_scores)
        pool_scores.append(child_scores.flatten())
        pool_tokens.append(child_top.flatten())
        pool_parent.append(lane_pool.repeat_interleave(K))
        best = top_indices(child_scores.flatten(), K)  # [K] the next lanes, best first
        scores, tokens, parent_lanes = child_scores.flatten()[best], child_top.flatten()[best], \
            best // K
        lane_pool = base + best
    drafter.end_tree()
    return select_nodes(torch.cat(pool_scores), torch.cat(pool_tokens), torch.cat(pool_parent),
                        shape.num_draft_tokens - 1)


def select_nodes(scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                 n: int) -> DraftTree:
    """Keep the ``n`` best of the pool (scores/tokens/parents [M], parents = pool index, -1 =
    root) in pool order, parents renumbered into the kept nodes; a node whose parent was not
    kept is dropped with its subtree (possible only under ties broken differently)."""
    keep = torch.sort(top_indices(scores, n)).values.tolist()
    out, index = DraftTree([], [], []), {}
    for p in keep:
        parent = int(parents[p])
        if parent != -1 and parent not in index:
            continue
        index[p] = len(out.tokens)
        out.tokens.append(int(tokens[p]))
        out.parents.append(-1 if parent == -1 else index[parent])
        out.depth.append(1 if parent == -1 else out.depth[index[parent]] + 1)
    return out


class TreeEagleDrafter(EagleDrafter):
    """:class:`TreeDrafter` over an :class:`Eagle3DraftModel`: the lanes are batch rows of a
    copy of the drafter's KV cache, so lane j's query sees the committed columns and lane j's
    own earlier draft columns (SGLang's layout, module doc); ``context="ancestors"`` reorders
    the rows' draft columns to each lane's parent first, so every node sees its ancestors."""

    def __init__(self, model, context: Literal["lane", "ancestors"] = "lane") -> None:
        super().__init__(model)
        self.context = context
        self._lanes = None

    def root_probs(self) -> torch.Tensor:
        return self._probs(self.last[:, -1])[0]

    def _probs(self, prenorm: torch.Tensor) -> torch.Tensor:
        """prenorm [B, H] -> softmax over the draft vocab, scattered to the verifier vocab
        (zero outside it), [B, V] float32."""
        return torch.softmax(self.full_logits(self.model.logits(prenorm[:, None])[:, 0].float()),
                             dim=-1)

    @torch.inference_mode()
    def lane_probs(self, tokens: torch.Tensor, parent_lanes: torch.Tensor) -> torch.Tensor:
        from specdraft.models.eagle3 import DraftKVCache

        K, base = len(tokens), self.cache.length
        if self._lanes is None:  # depth 1: K copies of the committed cache
            self._lanes = DraftKVCache()
            self._lanes.k, self._lanes.v = (t.expand(K, -1, -1, -1) for t in
                                            (self.cache.k, self.cache.v))
            self._hidden = self.last.expand(K, -1, -1)  # [K, 1, H]
        depth = self._lanes.length - base
        if self.context == "ancestors" and depth:
            idx = parent_lanes.to(self._lanes.k.device)
            self._lanes.k = torch.cat([self._lanes.k[:, :, :base], self._lanes.k[idx, :, base:]], 2)
            self._lanes.v = torch.cat([self._lanes.v[:, :, :base], self._lanes.v[idx, :, base:]], 2)
        # [K, 1, H] the parent's output as the next step reads it: the chain's one rule
        # (Eagle3DraftModel.feedback: normed with EAGLE-3.1's norm_output, else as is)
        h = self.model.feedback(self._hidden[parent_lanes.to(self._hidden.device)])
        dev = h.device
        pos = torch.full((K, 1), base + depth, device=dev)
        self._hidden = self.model.forward_cached(tokens.view(K, 1).to(dev), h, pos,
                                                 self._lanes)  # [K, 1, H]
        return self._probs(self._hidden[:, -1]).cpu()

    def end_tree(self) -> None:
        self._lanes = None


def verify_tree(verifier: VerifierSession, tree: DraftTree, root: int, committed: int
                ) -> tuple[list[int], int, torch.Tensor]:
    """Greedy tree verification (module doc). ``root``: the last committed token, not yet fed;
    ``committed``: committed tokens L (the cache holds L-1). Returns the accepted node tokens,
    the bonus token and the aux states [n+1, A] of the inputs ``root, accepted...``; the
    verifier cache is left holding ``L + n`` positions."""
    accepted, auxs = [], []
    node, token, length = -1, root, committed - 1
    while True:
        chain = _first_child_chain(tree, node)
        logits, aux = verifier.forward(torch.tensor([token] + [tree.tokens[c] for c in chain]))
        target = logits.argmax(-1).tolist()  # [1 + len(chain)]
        j = 0
        while j < len(chain) and target[j] == tree.tokens[chain[j]]:
            j += 1
        accepted += [tree.tokens[c] for c in chain[:j]]
        auxs.append(aux[: j + 1])
        length += j + 1
        verifier.crop(length)
        node = chain[j - 1] if j else node
        nxt = [c for c in tree.children(node) if tree.tokens[c] == target[j]]
        if not nxt:
            return accepted, target[j], torch.cat(auxs)
        node, token = nxt[0], target[j]
        accepted.append(token)


def _first_child_chain(tree: DraftTree, node: int) -> list[int]:
    """Nodes below ``node`` following the first child at each depth (the path tried first)."""
    chain = []
    while kids := tree.children(node):
        node = kids[0]
        chain.append(node)
    return chain


def generate_tree(verifier: VerifierSession, drafter: TreeDrafter, prompt: Sequence[int], *,
                  shape: TreeShape, max_new_tokens: int, eos_ids: Sequence[int] = ()
                  ) -> Generation:
    """Tree speculative decoding of up to ``max_new_tokens`` after ``prompt`` at temperature 0
    (module doc). Each verify step is recorded with k = the tree's depth, so per-position
    acceptance is per depth and ``topk = 1`` counts as the chain of ``steps`` drafts."""
    shape.check()
    t0 = time.perf_counter()
    ids = torch.tensor(list(prompt), dtype=torch.long)
    gen = prefill(verifier, drafter, ids, temperature=0.0, eos_ids=eos_ids, generator=None)
    while not gen.done(max_new_tokens):
        L = len(ids) + len(gen.tokens)
        tree = draft_tree(drafter, shape)
        path, bonus, aux = verify_tree(verifier, tree, gen.tokens[-1], L)
        n = len(path)
        # commit() reads drafts[:n] and k = len(drafts): pad the path to the tree's depth
        if gen.commit(path + [-1] * (tree.max_depth - n), n, bonus, eos_ids, max_new_tokens):
            break
        drafter.observe(L - 1, aux, torch.tensor(path + [bonus]))
    del gen.tokens[max_new_tokens:]
    gen.seconds = time.perf_counter() - t0
    return gen


def sglang_accept_length(gens: Sequence[Generation]) -> float:
    """SGLang's ``avg_spec_accept_length``: completion tokens (the prefill's first token
    included) / verify forwards."""
    steps = sum(g.stats.verify_steps for g in gens)
    return sum(len(g.tokens) for g in gens) / steps if steps else 0.0
