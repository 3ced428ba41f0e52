"""Batched offline decoding equals the batch-1 loop: same tokens, same per-step counts, the
same drafts proposed, at any batch size; and the slot bookkeeping by hand."""

import pytest
import torch
from greedy import greedy_reference

from specdraft.eval import batch as batch_mod
from specdraft.eval.batch import BatchEagleDrafter, BatchVerifier, Slots, generate_batch
from specdraft.eval.specdec import EagleDrafter, VerifierSession, generate
from specdraft.models.eagle3 import Eagle3Config, Eagle3DraftModel

AUX = [2, 3, 4]
LENGTHS = (5, 17, 9, 30, 3, 12, 8)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models():
    """A 6-layer random Llama (weight std 0.3: varied answers, see tests/engine/engine_kit.py)
    and a random drafter sharing its embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                      initializer_range=0.3, tie_word_embeddings=False)
    verifier = LlamaForCausalLM(cfg).eval()
    drafter = Eagle3DraftModel(Eagle3Config.from_verifier(cfg, draft_vocab_size=300,
                                                          aux_layer_ids=tuple(AUX))).eval()
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(verifier.get_input_embeddings().weight)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in LENGTHS]
    return verifier, drafter, prompts


class Recording(EagleDrafter):
    """Batch-1 drafter that records its drafts by context."""

    log: dict = {}

    def propose(self, context, k, temperature, generator):
        drafts, q = super().propose(context, k, temperature, generator)
        self.log[tuple(context.tolist())] = drafts.tolist()
        return drafts, q


class BatchRecording(BatchEagleDrafter):
    """Batched drafter that records each row's drafts by its context."""

    def __init__(self, model):
        super().__init__(model)
        self.log = {}

    def propose(self, contexts, k, temperature, generators):
        drafts, q = super().propose(contexts, k, temperature, generators)
        for c, d in zip(contexts, drafts.tolist()):
            self.log[tuple(c.tolist())] = d
        return drafts, q


def seeded(n):
    return [torch.Generator().manual_seed(100 + i) for i in range(n)]


def one_by_one(verifier, drafter, prompts, *, temperature=0.0, **kw):
    Recording.log = {}
    gens = seeded(len(prompts))
    out = [generate(VerifierSession(verifier, AUX), Recording(drafter), p, generator=g,
                    temperature=temperature, **kw) for p, g in zip(prompts, gens)]
    return out, dict(Recording.log)


def batched(verifier, drafter, prompts, batch_size, *, temperature=0.0, **kw):
    d = BatchRecording(drafter)
    out = generate_batch(BatchVerifier(verifier, AUX), d, prompts, batch_size=batch_size,
                         generators=seeded(len(prompts)), temperature=temperature, **kw)
    return out, d.log


def steps(g):
    return [(s.k, s.accepted, s.committed) for s in g.stats.steps]


@pytest.mark.parametrize("temperature,method", [(0.0, "greedy"), (1.0, "probabilistic"),
                                                (1.0, "greedy")])
def test_batched_equals_batch_1_tokens_counts_and_drafts(models, temperature, method,
                                                         monkeypatch):
    """Batches 2, 3 and 8 (rows join as others finish; prompts of 3..30 tokens) give every
    prompt the batch-1 loop's tokens, per-step (drafted, accepted, committed) and drafts. At
    temperature 1 with probabilistic drafting the random drafter is partly accepted (every
    prefix length occurs), so rows grow by different counts each step: padding, holes and
    compaction are all exercised; greedy drafting at temperature 1 is checked equal too."""
    verifier, drafter, prompts = models
    kw = {"k": 3, "max_new_tokens": 40, "temperature": temperature, "eos_ids": [7],
          "draft_sample_method": method}
    ref, ref_drafts = one_by_one(verifier, drafter, prompts, **kw)
    if temperature == 0:
        assert [g.tokens for g in ref[:2]] == [greedy_reference(verifier, p, len(g.tokens))
                                               for p, g in zip(prompts[:2], ref)]
    elif method == "probabilistic":
        accepted = {s.accepted for g in ref for s in g.stats.steps}
        assert accepted == {0, 1, 2, 3}
    compacted = []
    real = Slots.compact

    def counting(self, tensors, **kw):
        out = real(self, tensors, **kw)
        compacted.append(out is not tensors)
        return out

    monkeypatch.setattr(Slots, "compact", counting)
    for B in (2, 3, 8):
        out, drafts = batched(verifier, drafter, prompts, B, **kw)
        assert [g.tokens for g in out] == [g.tokens for g in ref], B
        assert [steps(g) for g in out] == [steps(g) for g in ref], B
        assert drafts == ref_drafts, B
        assert [g.stop for g in out] == [g.stop for g in ref]
    if method == "probabilistic" or temperature == 0:
        assert sum(compacted) >= 10  # holes were gathered out, many times


def test_eos_and_length_one_rows_leave_the_batch(models):
    """A prompt whose first token is already an EOS (or max_new_tokens 1) never joins the
    batch; the others still match batch 1."""
    verifier, drafter, prompts = models
    first = [generate(VerifierSession(verifier, AUX), EagleDrafter(drafter), p, k=2,
                      max_new_tokens=1).tokens[0] for p in prompts]
    kw = {"k": 2, "max_new_tokens": 12, "eos_ids": [first[1], first[4]]}
    ref, _ = one_by_one(verifier, drafter, prompts, **kw)
    out, _ = batched(verifier, drafter, prompts, 3, **kw)
    assert [g.tokens for g in out] == [g.tokens for g in ref]
    assert out[1].tokens == [first[1]] and out[1].stop == "eos" and out[1].stats.verify_steps == 0
    short, _ = batched(verifier, drafter, prompts, 4, k=2, max_new_tokens=1)
    assert [g.tokens for g in short] == [[t] for t in first]


def test_positions_from_slot_indices_are_caught(models, monkeypatch):
    """Planted fault: rotary positions = slot index (padding and holes counted) instead of the
    count of valid slots. The equality above then fails."""
    verifier, drafter, prompts = models
    kw = {"k": 3, "max_new_tokens": 30, "temperature": 1.0,
          "draft_sample_method": "probabilistic"}  # partial acceptance: holes (test above)
    ref, _ = one_by_one(verifier, drafter, prompts, **kw)
    monkeypatch.setattr(Slots, "length", property(lambda s: torch.full(
        (s.valid.shape[0],), s.valid.shape[1], dtype=torch.long)))
    out, _ = batched(verifier, drafter, prompts, 3, **kw)
    assert [g.tokens for g in out] != [g.tokens for g in ref]


def test_slots_join_select_compact_by_hand():
    s = Slots(torch.tensor([[True, False, True]]))
    a = torch.arange(3.0).view(1, 1, 3, 1)                        # row 0: slots 0, 1, 2
    b = torch.tensor([10.0, 11.0]).view(1, 1, 2, 1)               # row 1: 2 slots
    (t,) = s.join([a], [b], torch.ones(1, 2, dtype=torch.bool))
    assert t[:, 0, :, 0].tolist() == [[0, 1, 2], [0, 10, 11]]    # row 1 left-padded
    assert s.valid.tolist() == [[True, False, True], [False, True, True]]
    assert s.length.tolist() == [2, 2]
    (c,) = s.compact([t], slack=0.0)                              # holes out, order kept
    assert c[:, 0, :, 0].tolist() == [[0, 2], [10, 11]] and s.valid.all()
    (d,) = s.select([c], [1])
    assert d[:, 0, :, 0].tolist() == [[10, 11]] and s.valid.tolist() == [[True, True]]
    assert s.compact([d])[0] is d                                  # nothing to gain


def test_batch_size_option_in_eval_run(tmp_path, models, monkeypatch):
    """offline_eval's decode() picks the batched loop for --batch-size > 1, per-prompt seeds."""
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import decode

    verifier, drafter, prompts = models
    seen = {}
    real = batch_mod.generate_batch

    def spy(*a, **kw):
        seen.update(kw)
        return real(*a, **kw)

    monkeypatch.setattr(batch_mod, "generate_batch", spy)
    cfg = dict(drafter=tmp_path, out=tmp_path / "o", prompts=tmp_path / "p.jsonl", k=2,
               max_new_tokens=6, temperature=0.5, seed=4)
    one = decode(EvalConfig(**cfg), verifier, drafter, prompts[:3], [])
    four = decode(EvalConfig(**cfg, batch_size=4), verifier, drafter, prompts[:3], [])
    assert seen["batch_size"] == 4
    assert seen["generators"][2].initial_seed() == 6
    assert [g.tokens for g in four] == [g.tokens for g in one]


def test_decode_in_chunks_draws_the_same_tokens(tmp_path, models, monkeypatch, capsys):
    """eval's decode calls the kind's decoder a chunk of prompts at a time (so the progress
    line counts decoded prompts, issue 40); prompt i still samples with seed + i, so at
    temperature 0.5 the tokens equal one call over all prompts, batched or not."""
    import specdraft.eval.run as eval_run
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import decode

    verifier, drafter, prompts = models
    cfg = dict(drafter=tmp_path, out=tmp_path / "o", prompts=tmp_path / "p.jsonl", k=2,
               max_new_tokens=6, temperature=0.5, seed=4)
    monkeypatch.setattr(eval_run, "DECODE_CHUNK_BATCHES", 100)
    whole = decode(EvalConfig(**cfg), verifier, drafter, prompts[:3], [])
    capsys.readouterr()
    monkeypatch.setattr(eval_run, "DECODE_CHUNK_BATCHES", 1)
    for batch in (1, 2):
        parts = decode(EvalConfig(**cfg, batch_size=batch), verifier, drafter, prompts[:3], [])
        assert [g.tokens for g in parts] == [g.tokens for g in whole], batch
    err = capsys.readouterr().err
    tokens = sum(len(g.tokens) for g in whole)
    assert "\r" not in err and err.count("eval: offline decode: 3/3 prompts (100%)") == 2
    assert f"; tokens {tokens:,} committed" in err
