"""The seam of drafter kinds (docs/architecture.md "Kinds"): a third kind registered from the
tests (:mod:`toy_kind`, a low-rank bigram) goes through the real stages' ``run()`` — train,
export, offline eval — with no edit under ``src/``; the exported tensors are the trained ones,
and the eval's counts equal an independent replay of the bigram against plain greedy decoding."""

import json

import pytest
import torch
from greedy import greedy_reference
from memsource import MemorySource, write_vocab
from safetensors.torch import load_file

import toy_kind
from specdraft import kinds

K, MAX_NEW, GEN = 3, 10, 16


@pytest.fixture
def toy():
    kinds.register(toy_kind.KIND)
    yield toy_kind.KIND
    kinds.unregister(toy_kind.NAME)


def replay(table_model, prompt: list[int], greedy: list[int], eos: set[int]) -> dict:
    """The verify steps a greedy chain drafter makes against the verifier's greedy tokens
    ``greedy`` (the first comes from the prefill, not a verify step): per step, the drafts
    accepted are the longest prefix equal to the greedy continuation, then one verifier token."""
    new, steps, accepted, per_pos = [greedy[0]], 0, 0, [0] * K
    while len(new) < MAX_NEW and new[-1] not in eos:
        drafts = toy_kind.chain(table_model, new[-1], K).tolist()
        n = 0
        while n < K and drafts[n] == greedy[len(new) + n]:
            n += 1
        committed = drafts[:n] + [greedy[len(new) + n]]
        cut = next((i + 1 for i, t in enumerate(committed) if t in eos), len(committed))
        steps, accepted = steps + 1, accepted + min(n, cut)
        for i in range(min(n, cut)):
            per_pos[i] += 1
        new += committed[:cut]
    return {"tokens": new[:MAX_NEW], "verify_steps": steps, "accepted": accepted,
            "per_position_accepted": per_pos}


def test_a_kind_registered_from_tests_trains_exports_and_evaluates(
        tmp_path, toy, six_layer_verifier, six_layer_verifier_dir):
    from specdraft.core.chat import generation_stop_ids
    from specdraft.core.verifier import load_tokenizer
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.prompts import eval_chat_format, load_prompts, render
    from specdraft.eval.run import run as evaluate
    from specdraft.export.config import ExportConfig
    from specdraft.export.run import run as export
    from specdraft.train.config import TrainConfig
    from specdraft.train.run import run as train

    verifier = six_layer_verifier
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "messages": [
        {"role": "user", "content": text}]}) + "\n" for i, text in enumerate(
        ["What is 2+2?", "Name a colour.", "Count to five."])))
    config = EvalConfig(run_dir=tmp_path / "run", drafter=tmp_path / "run" / "export" / "toy",
                        verifier=str(six_layer_verifier_dir), prompts=prompts, k=K,
                        max_new_tokens=MAX_NEW, engine="none")
    tokenizer = load_tokenizer(str(six_layer_verifier_dir))
    fmt = eval_chat_format(config, tokenizer)
    rendered = [render(tokenizer, p["messages"], fmt) for p in load_prompts(prompts)]
    # the training rows: the verifier's greedy answers to the eval prompts (twice, so that the
    # validation split has rows), which the bigram can memorise
    greedy = [greedy_reference(verifier, ids, GEN) for ids in rendered]
    corpus = [(f"q{i}/{c}", ids + g, [0] * len(ids) + [1] * GEN)
              for c in range(2) for i, (ids, g) in enumerate(zip(rendered, greedy))]
    run_dir = tmp_path / "run"
    write_vocab(run_dir, corpus, verifier.config.vocab_size)
    source = MemorySource(verifier, corpus, aux_layer_ids=(2, 3, 4))
    # another kind's option is refused with the usual message
    with pytest.raises(ValueError, match="--ttt-steps: not an option of the toy drafter"):
        TrainConfig(run_dir=run_dir, drafter="toy", ttt_steps=3)

    m = train(TrainConfig(run_dir=run_dir, drafter="toy", epochs=100, max_steps=16, lr=0.1,
                          warmup_steps=1, batch_tokens=64 * 2, val_fraction=0.2, eval_every=8,
                          save_every=8, log_every=4, teacher_check=False),
              verifier=verifier, source=source)
    losses = [json.loads(r)["loss"] for r in
              (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
              if json.loads(r)["split"] == "train"]
    assert losses[-1] < losses[0] - 2.0  # nats: from ln(V) = 10.8 at the start
    saved = json.loads((run_dir / "train" / "best" / "drafter_config.json").read_text())
    assert saved["kind"] == "toy" and m["drafter_config"]["kind"] == "toy"
    trained = load_file(str(run_dir / "train" / "best" / "drafter.safetensors"))

    em = export(ExportConfig(run_dir=run_dir, format="toy"))
    out = run_dir / "export" / "toy"
    assert em["out"] == str(out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["ToyBigram"] and "kind" not in cfg  # detected by its arch
    exported = load_file(str(out / "model.safetensors"))
    assert exported.keys() == trained.keys() == {"emb", "out"}
    assert all(torch.equal(exported[k], trained[k]) for k in trained)

    evaluate(config, verifier=verifier)
    res = json.loads((run_dir / "eval" / "results.json").read_text())

    eos = set(generation_stop_ids(verifier, tokenizer, fmt))
    table = toy_kind.ToyDrafter(toy_kind.ToyConfig.from_dict(cfg))
    table.load_state_dict(exported)
    want_steps = want_accepted = 0
    for ids, g, row in zip(rendered, greedy, res["prompts"]):
        ref = replay(table, ids, g, eos)
        assert row["tokens"] == ref["tokens"] == g[:len(row["tokens"])]
        assert (row["verify_steps"], row["accepted"], row["per_position_accepted"]) == \
            (ref["verify_steps"], ref["accepted"], ref["per_position_accepted"])
        assert row["drafted"] == K * row["verify_steps"]
        want_steps += ref["verify_steps"]
        want_accepted += ref["accepted"]
    assert (res["verify_steps"], res["accepted"], res["drafted"]) == \
        (want_steps, want_accepted, K * want_steps)
    assert res["tau"] == pytest.approx(sum(p["committed"] for p in res["prompts"]) / want_steps)
    assert want_accepted > 0  # the bigram learnt something the verifier accepts


def test_a_kind_is_declared_and_detected_in_one_place(toy):
    """The declared field decides; an engine config by its architecture; a legacy specdraft
    config (no field) by the DFlash keys, else EAGLE-3."""
    assert kinds.detect_kind({"kind": "toy", "mask_token_id": 1, "target_layer_ids": [0]}) == "toy"
    assert kinds.detect_kind({"architectures": ["ToyBigram"]}) == "toy"
    assert kinds.detect_kind({"architectures": ["DFlashDraftModel"]}) == "dflash"
    assert kinds.detect_kind({"architectures": ["Eagle3Speculator"]}) == "eagle3"
    assert kinds.detect_kind({"mask_token_id": 1, "target_layer_ids": [0]}) == "dflash"
    assert kinds.detect_kind({"hidden_size": 64}) == "eagle3"
    from specdraft.core.errors import InputError

    with pytest.raises(InputError, match="kind 'bigram' is not a registered drafter kind"):
        kinds.detect_kind({"kind": "bigram"}, where="x/drafter_config.json")
