"""SGLang-style EAGLE tree eval (specdraft.eval.tree): chain equality at topk 1, a hand-built
tree's hand-counted accept length, greedy output, SGLang's own tree-building test vector, ties,
and the shapes an engine refuses."""

import pytest
import torch
from bigram import AUX, bigram_models
from greedy import greedy_reference

from specdraft.core.errors import ConfigError
from specdraft.eval.specdec import EagleDrafter, VerifierSession, generate
from specdraft.eval.shapes import TreeShape, check_engine_shape
from specdraft.models.eagle3 import Eagle3DraftModel
from specdraft.eval.tree import (TreeEagleDrafter, draft_tree, generate_tree, select_nodes,
                                 sglang_accept_length, top_indices)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models():
    return bigram_models()


def steps(g):
    return [(s.k, s.accepted, s.committed) for s in g.stats.steps]


def test_topk_1_equals_the_chain_eval(models):
    verifier, drafter, prompts = models
    for prompt in prompts:
        chain = generate(VerifierSession(verifier, AUX), EagleDrafter(drafter), prompt, k=3,
                         max_new_tokens=24)
        tree = generate_tree(VerifierSession(verifier, AUX), TreeEagleDrafter(drafter), prompt,
                             shape=TreeShape(3, 1, 4), max_new_tokens=24)
        assert tree.tokens == chain.tokens
        assert steps(tree) == steps(chain)
        assert tree.stats.per_position_accepted() == chain.stats.per_position_accepted()


def test_topk_1_drafts_what_the_chain_drafts_with_norm_output(models):
    """EAGLE-3.1's norm_output: the next draft step reads norm(prenorm). The tree feeds its
    lanes by the chain's one rule (Eagle3DraftModel.feedback), so at topk 1 its nodes are the
    chain's drafts, depth by depth, on a random drafter whose final norm gain is randomised
    (planted: the tree fed the raw state; its depth-2+ drafts differed and this failed)."""
    from dataclasses import replace

    _, drafter, _ = models
    torch.manual_seed(5)
    normed = Eagle3DraftModel(replace(drafter.config, norm_output=True)).eval()
    with torch.no_grad():
        normed.norm.weight.copy_(torch.rand(normed.norm.weight.shape) * 3)
    g = torch.Generator().manual_seed(2)
    for m in (3, 7, 12):
        feats = torch.randn(m, 3 * 64, generator=g)
        tokens = torch.randint(0, 16, (m,), generator=g)
        chain, tree = EagleDrafter(normed), TreeEagleDrafter(normed)
        chain.observe(0, feats, tokens)
        tree.observe(0, feats, tokens)
        drafts, _ = chain.propose(tokens, 5, 0.0, None)
        nodes = draft_tree(tree, TreeShape(5, 1, 6))
        assert nodes.tokens == drafts.tolist() and nodes.depth == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("context", ["lane", "ancestors"])
def test_trees_commit_the_greedy_continuation(models, context):
    verifier, drafter, prompts = models
    for prompt in prompts:
        g = generate_tree(VerifierSession(verifier, AUX), TreeEagleDrafter(drafter, context),
                          prompt, shape=TreeShape(4, 3, 9), max_new_tokens=20)
        assert g.tokens == greedy_reference(verifier, prompt, 20)
        assert all(s.k <= 4 and s.accepted <= s.k for s in g.stats.steps)


class PathStub:
    """A drafter whose distributions are written by hand per draft path (tuple of tokens after
    the last committed one); the verifier stand-in below continues a fixed text."""

    def __init__(self, table):
        self.table, self.lanes = table, [()]

    def observe(self, start, feats, tokens):
        self.committed = tokens.tolist()

    def _dist(self, path):
        p = torch.zeros(8)
        for t, w in self.table.get(path, {7: 1.0}).items():
            p[t] = w
        return p

    def root_probs(self):
        self.lanes = [()]
        return self._dist(())

    def lane_probs(self, tokens, parent_lanes):
        self.lanes = [self.lanes[p] + (int(t),) for t, p in zip(tokens, parent_lanes)]
        return torch.stack([self._dist(path) for path in self.lanes])

    def end_tree(self):
        pass


def test_hand_built_tree_and_its_accept_length():
    """Depth 1: 3 (0.6), 4 (0.4). Below 3: 5 (0.5), 1 (0.5); below 4: 2 (0.9), 6 (0.1).
    S=2, K=2, N=4: pool [3 .6, 4 .4 | 3>5 .3, 3>1 .3, 4>2 .36, 4>6 .04]; the 3 best are 3, 4
    and 4>2, in pool order. The verifier's greedy text is 5 | 4 2 0 | 3 1 | 4 6 (prefill | steps):
    step 1 (root 5): 4 accepted, 4>2 accepted, bonus 0 -> 2 accepted, 3 committed;
    step 2 (root 0): 3 accepted (no child kept), bonus 1 -> 1, 2;
    step 3 (root 1): 4 accepted, 6 is not a kept child of 4, bonus 6 -> 1, 2.
    tau = 7/3; SGLang's accept length (the prefill's token counted) = 8/3; depth 1 accepted
    3/3 steps, depth 2 1/3."""
    shape = TreeShape(steps=2, topk=2, num_draft_tokens=4)
    stub = PathStub({(): {3: 0.6, 4: 0.4}, (3,): {5: 0.5, 1: 0.5}, (4,): {2: 0.9, 6: 0.1}})
    tree = draft_tree(stub, shape)
    assert (tree.tokens, tree.parents, tree.depth) == ([3, 4, 2], [-1, -1, 1], [1, 1, 2])

    text = [5, 4, 2, 0, 3, 1, 4, 6]
    g = generate_tree(TextVerifier(text), stub, [6], shape=shape, max_new_tokens=8)
    assert g.tokens == text
    assert [(s.k, s.accepted, s.committed) for s in g.stats.steps] == [(2, 2, 3), (2, 1, 2),
                                                                       (2, 1, 2)]
    assert g.stats.tau == pytest.approx(7 / 3)
    assert sglang_accept_length([g]) == pytest.approx(8 / 3)
    assert g.stats.per_position() == pytest.approx([1.0, 1 / 3])
    assert [s.context for s in g.stats.steps] == [2, 5, 7]  # prompt 1 + tokens before


class TextVerifier:
    """A :class:`VerifierSession` stand-in whose greedy continuation is a fixed text: the
    argmax after position i of the output is ``text[i]`` (the prompt is one token)."""

    def __init__(self, text):
        self.text, self.length, self.fed = text, 0, []

    def forward(self, ids):
        logits = torch.full((len(ids), 8), -1.0)
        for i, t in enumerate(ids.tolist()):
            self.fed = self.fed[: self.length] + [t]
            self.length += 1
            n = self.length - 1  # output index predicted after this input
            logits[i, self.text[n] if n < len(self.text) and self._on_text() else 7] = 1.0
        return logits, torch.zeros(len(ids), 2)

    def _on_text(self):
        return self.fed[1:] == self.text[: len(self.fed) - 1]

    def crop(self, length):
        self.length = length
        self.fed = self.fed[:length]


def test_sglang_build_tree_test_vector():
    """SGLang's own expected tree (``build_eagle_tree.py`` ``test_build_tree_kernel_efficient``,
    request 0: topk 4, depth 4, 8 draft tokens): its pool scores, tokens and parent list in,
    its ``draft_tokens`` and its first-child/next-sibling links out."""
    s0 = [7.1127e-01, 2.8292e-01, 2.2995e-03, 1.7357e-03]
    s1 = [[6.9142e-01, 1.2863e-02, 1.6873e-03, 1.1871e-03],
          [2.4787e-01, 1.8818e-02, 1.4204e-02, 9.2235e-04],
          [2.2971e-03, 1.6700e-06, 1.8737e-07, 8.3146e-08],
          [1.2771e-03, 2.4374e-04, 1.7832e-04, 1.1947e-05]]
    s2 = [[6.6438e-01, 2.6997e-02, 2.4236e-05, 4.0821e-06],
          [2.4402e-01, 2.8409e-03, 5.0935e-04, 2.9022e-04],
          [1.6178e-02, 2.0567e-03, 4.5892e-04, 3.0034e-05],
          [1.3023e-02, 5.0497e-04, 3.6371e-04, 8.7750e-05]]
    s3 = [[6.6420e-01, 1.0525e-04, 6.5864e-05, 1.2253e-06],
          [1.3019e-01, 1.0461e-01, 5.2083e-03, 1.6777e-03],
          [2.0103e-02, 6.7335e-03, 1.2625e-04, 1.0364e-05],
          [1.5142e-02, 7.0819e-04, 9.6595e-05, 8.7951e-05]]
    tokens = [29896, 29906, 29900, 29945,
              29889, 29974, 29945, 29900, 29974, 29922, 29930, 29958,
              29889, 29974, 29930, 29945, 29974, 29922, 29930, 29958,
              29946, 29945, 29953, 29906, 29896, 29945, 29900, 29906,
              29896, 29945, 29906, 29953, 29896, 29945, 29906, 29946,
              29946, 29974, 29945, 29930, 29889, 29922, 29974, 29930,
              29974, 29946, 29930, 29922, 29889, 29974, 29945, 29922]
    scores = torch.tensor(s0 + sum(s1, []) + sum(s2, []) + sum(s3, []))
    # SGLang's parent of pool entry t is parent_list[t // topk], parent_list = the step-0
    # [-1, 0, 1, 2, 3] then each step's selected pool indices (its parents_list[:-1])
    parent_list = [-1, 0, 1, 2, 3, 4, 8, 9, 10, 20, 24, 21, 28]
    parents = torch.tensor([parent_list[t // 4] for t in range(len(tokens))])
    tree = select_nodes(scores, torch.tensor(tokens), parents, 7)
    assert tree.tokens == [29896, 29906, 29889, 29974, 29946, 29896, 29946]  # after the root
    # SGLang: retrive_next_token [1, 3, 4, 5, 6, 7, -1, -1], next_sibling [-1, 2, -1, ...]
    # (index 0 = root): root -> 1, 2; 1 -> 3; 2 -> 4; 3 -> 5; 4 -> 6; 5 -> 7
    assert [p + 1 for p in tree.parents] == [0, 0, 1, 2, 3, 4, 5]
    assert tree.depth == [1, 1, 2, 2, 3, 3, 4]  # SGLang's positions 5 + [1, 1, 2, 2, 3, 3, 4]


def test_ties_go_to_the_lower_index():
    """Lower index first among equals: what ``torch.max`` (SGLang's top-1 path, documented)
    returns; ``torch.topk``'s order among equals is undocumented (on CPU here it is not this
    one: benchmarks/topk_ties_cuda.py prints both, and CUDA's where a GPU is present)."""
    v = torch.tensor([0.1, 0.3, 0.3, 0.05, 0.3, 0.1])
    assert top_indices(v, 4).tolist() == [1, 2, 4, 0]
    assert top_indices(v, 1).tolist() == [int(torch.max(v[None], dim=-1).indices)]
    # a child whose probability is exactly 1 ties its parent: the parent (lower index) is kept
    tree = select_nodes(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([3, 4, 5]),
                        torch.tensor([-1, -1, 0]), 2)
    assert tree.tokens == [3, 4] and tree.parents == [-1, -1]


@pytest.mark.parametrize("shape, engine, words", [
    (TreeShape(3, 1, 6), "sglang", "speculative_num_steps + 1 = 4"),
    (TreeShape(4, 2, 4), "sglang", "below --k + 1 = 5"),
    (TreeShape(2, 2, 8), "sglang", "K + (S-1)·K² = 6"),
    (TreeShape(3, 2, 6), "vllm", "vLLM 0.32 drafts a chain"),
])
def test_shapes_the_engine_refuses(shape, engine, words):
    with pytest.raises(ConfigError, match=words.replace("+", r"\+").replace("(", r"\(")
                       .replace(")", r"\)")):
        shape.check()
        check_engine_shape(engine, shape)
    TreeShape(2, 2, 7).check()  # the largest tree of S=2, K=2
    check_engine_shape("vllm", TreeShape(3, 1, 4))


def test_three_level_hand_tree_follows_the_lanes_reranking():
    """S=3, K=2, N=6. Depth 1: 1 (0.7), 2 (0.3). Below 1: 3 (0.6), 4 (0.4); below 2: 5 (0.9),
    6 (0.1). Depth-2 scores 1>3 .42, 1>4 .28, 2>5 .27, 2>6 .03: lanes 1>3 then 1>4 (both from
    lane 0). Below 1>3: 7 (0.5), 0 (0.5); below 1>4: 6 (1.0). Depth-3 scores .21, .21, .28, 0.
    Pool (index: token score): 0:1 .7, 1:2 .3, 2:3 .42, 3:4 .28, 4:5 .27, 5:6 .03, 6:0 .21,
    7:7 .21, 8:6 .28, 9:0 0. The 5 best: 0, 2, 1, 3, 8 (the .28 tie: index 3 before 8),
    in pool order 0, 1, 2, 3, 8 = tokens 1, 2, 3, 4, 6 with parents root, root, 1, 1, 1>4."""
    stub = PathStub({(): {1: 0.7, 2: 0.3}, (1,): {3: 0.6, 4: 0.4}, (2,): {5: 0.9, 6: 0.1},
                     (1, 3): {7: 0.5, 0: 0.5}, (1, 4): {6: 1.0}})
    tree = draft_tree(stub, TreeShape(3, 2, 6))
    assert tree.tokens == [1, 2, 3, 4, 6]
    assert tree.parents == [-1, -1, 0, 0, 3]
    assert tree.depth == [1, 1, 2, 2, 3]


@torch.inference_mode()
def test_lane_and_ancestor_draft_attention(models):
    """Depth 2 with the lanes swapped (lane 0 = child of depth-1 lane 1): with ``ancestors``
    the node sees its parent's column, with ``lane`` (SGLang's KV layout) lane 0's own depth-1
    column; both take the parent's output as feature. Checked against forward_cached by hand."""
    verifier, model, prompts = models
    s = VerifierSession(verifier, AUX)
    ids = torch.tensor(prompts[1])
    _, aux = s.forward(ids)
    a, b, c, e = 3, 8, 11, 2

    def probs(drafter, context):
        d = TreeEagleDrafter(model, context)
        d.observe(0, aux, ids.roll(-1))
        d.lane_probs(torch.tensor([a, b]), torch.tensor([0, 0]))
        return d, d.lane_probs(torch.tensor([c, e]), torch.tensor([1, 0]))

    d, lane = probs(model, "lane")
    _, anc = probs(model, "ancestors")
    base = d.cache.length

    def run(cache_tokens, feature_token, token):
        """Feed cache_tokens (each with the last committed feature) at depth 1 into a copy of
        the committed cache, then ``token`` at depth 2 with ``feature_token``'s output."""
        from specdraft.models.eagle3 import DraftKVCache
        outs = {}
        for t in {cache_tokens, feature_token}:
            cache = DraftKVCache()
            cache.k, cache.v = d.cache.k, d.cache.v
            outs[t] = (cache, model.forward_cached(torch.tensor([[t]]), d.last,
                                                   torch.tensor([[base]]), cache))
        cache = outs[cache_tokens][0]
        h = outs[feature_token][1]
        out = model.forward_cached(torch.tensor([[token]]), h, torch.tensor([[base + 1]]), cache)
        return d._probs(out[:, -1])[0]

    torch.testing.assert_close(anc[0], run(b, b, c))    # path b > c
    torch.testing.assert_close(lane[0], run(a, b, c))   # lane 0 holds a, feature from b
    torch.testing.assert_close(lane[1], run(b, a, e))
    assert not torch.allclose(lane[0], anc[0])
