"""The run's verifier contract, ``RUN/verifier.json``: written by the first stage that touches
the verifier or its tokenizer, read and checked by the later ones (issue #27 item 2)."""

import json

import pytest

from specdraft.artifacts import verifier_contract
from specdraft.core.errors import ConfigError
from specdraft.extract.config import ExtractConfig
from specdraft.extract.run import run as extract
from specdraft.generate.config import GenerateConfig
from specdraft.generate.run import run as generate
from specdraft.prepare.config import PrepareConfig
from specdraft.prepare.run import run as prepare

PROMPTS = [{"id": f"p{i}", "prompt": q} for i, q in enumerate(
    ["What is 2+2?", "Name a colour.", "Say hello in French."])]


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


@pytest.fixture
def template(tmp_path, tiny_verifier_dir):
    """The verifier's own template behind a comment: renders the same text, hashes differently."""
    from transformers import AutoTokenizer

    path = tmp_path / "template.jinja"
    path.write_text("{#- ours -#}" + AutoTokenizer.from_pretrained(tiny_verifier_dir).chat_template)
    return path


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def _generate(run_dir, prompts, verifier, **kw):
    return generate(GenerateConfig(prompts=str(prompts), run_dir=str(run_dir), backend="local",
                                   verifier=str(verifier), max_tokens=4, keep_truncated=True,
                                   **kw))


def test_local_generation_writes_the_contract_and_prepare_renders_with_it(
        tmp_path, prompts, template, tiny_verifier_dir):
    """Generate (local, a template file) is the first stage to touch the tokenizer: it writes
    the contract. prepare, given no chat settings, renders with the run's template (before: it
    resolved the tokenizer's own and stopped: "prepare would render chats unlike the local
    generation"); given another template explicitly, it is refused naming the contract."""
    run_dir = tmp_path / "run"
    _generate(run_dir, prompts, tiny_verifier_dir, chat_template=str(template))
    c = verifier_contract.load(run_dir)
    assert c.written_by == "generate"
    assert c.chat.template_sha256 == _sha(template.read_text())
    assert (c.chat.template_source, c.chat.stop_tokens) == (str(template), ["<|im_end|>"])
    assert (c.vocab_size, c.tokenizer_size) == (49152, 49152)  # SmolLM2's, the tiny one's head
    assert (c.profile["model_type"], c.profile["n_layers"], c.profile["hidden_size"]) \
        == ("llama", 4, 64)
    assert c.identity["path"] == str(tiny_verifier_dir) and c.loading.trust_remote_code is False

    prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(tiny_verifier_dir)))
    used = json.loads((run_dir / "prepare" / "chat_format.json").read_text())
    assert used["template_sha256"] == _sha(template.read_text())
    assert verifier_contract.load(run_dir) == c  # read, not rewritten

    other = tmp_path / "other.jinja"
    other.write_text("{#- another -#}" + template.read_text())
    with pytest.raises(ConfigError) as err:
        prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(tiny_verifier_dir),
                              chat_template=str(other), overwrite=True))
    msg = str(err.value)
    assert f"{run_dir / 'verifier.json'} (written by generate)" in msg
    assert "template_sha256" in msg and "start a new --run-dir" in msg
    # explicit settings equal to the run's are accepted
    prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(tiny_verifier_dir),
                          chat_template=str(template), overwrite=True))


def _reseeded_copy(src, out):
    """The same config and tokenizer, other random weights."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src)
    torch.manual_seed(1)
    for p in model.parameters():
        p.data.normal_(0.0, 0.02)
    model.save_pretrained(out)
    for f in src.iterdir():
        if "token" in f.name or f.name.endswith(".jinja"):
            shutil.copy(f, out / f.name)
    return out


def test_extract_refuses_another_verifier_before_loading_it(
        tmp_path, prompts, tiny_verifier_dir, monkeypatch):
    """The run generated and prepared with one verifier; extract given another model of the same
    shapes and tokenizer is refused with the weights named, and the model is never loaded."""
    import specdraft.core.verifier as verifier_mod

    run_dir = tmp_path / "run"
    _generate(run_dir, prompts, tiny_verifier_dir)
    prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(tiny_verifier_dir)))
    other = _reseeded_copy(tiny_verifier_dir, tmp_path / "other")

    def no_load(*a, **k):
        raise AssertionError("the verifier was loaded before the contract was checked")

    monkeypatch.setattr(verifier_mod, "load_verifier", no_load)
    with pytest.raises(ConfigError) as err:
        extract(ExtractConfig(run_dir=run_dir, verifier=str(other)))
    msg = str(err.value)
    assert "written by generate" in msg and f"--verifier {tiny_verifier_dir}" in msg
    assert "another model" in msg and "weights (sampled fingerprint of" in msg
    assert not (run_dir / "extract" / "manifest.json").exists()


def test_a_tokenizer_only_first_stage_leaves_the_identity_to_extract(
        tmp_path, tiny_verifier_dir, smollm2_tokenizer_dir):
    """prepare with ``--tokenizer`` and a verifier path that does not exist here (it lives on the
    serving machine) writes the contract without an identity; extract, the first stage with the
    model, fills it once (``filled_by``); the other fields are never changed."""
    run_dir = tmp_path / "run"
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"id": f"c{i}", "messages": [
        {"role": "user", "content": f"Count to {i + 2}."},
        {"role": "assistant", "content": " ".join(str(j) for j in range(1, i + 3))}]}) + "\n"
        for i in range(4)))
    prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(tmp_path / "on-the-server"),
                          tokenizer=str(smollm2_tokenizer_dir), data=str(data)))
    first = verifier_contract.load(run_dir)
    assert (first.identity, first.profile, first.vocab_size) == (None, None, 49152)
    assert "on-the-server" in first.profile_error

    extract(ExtractConfig(run_dir=run_dir, verifier=str(tiny_verifier_dir), aux_layers=(1, 2, 3)))
    filled = verifier_contract.load(run_dir)
    assert filled.identity["path"] == str(tiny_verifier_dir)
    assert filled.profile["n_layers"] == 4
    assert filled.filled_by == {"identity": "extract", "profile": "extract"}
    assert filled.model_copy(update={"identity": None, "profile": None, "filled_by": {},
                                     "profile_error": first.profile_error}) == first


def test_a_rerun_of_the_writing_stage_rewrites_it_and_the_file_is_checked(
        tmp_path, prompts, template, tiny_verifier_dir):
    """generate rerun with other chat settings starts the run over: the contract follows it. A
    damaged contract is an error naming the file, never silently replaced."""
    run_dir = tmp_path / "run"
    _generate(run_dir, prompts, tiny_verifier_dir)
    assert verifier_contract.load(run_dir).chat.template_source == "tokenizer"
    _generate(run_dir, prompts, tiny_verifier_dir, chat_template=str(template), overwrite=True)
    assert verifier_contract.load(run_dir).chat.template_source == str(template)

    path = run_dir / "verifier.json"
    path.write_text(path.read_text().replace('"vocab_size"', '"vocab_sise"'))
    from specdraft.core.errors import InputError

    with pytest.raises(InputError, match=r"verifier\.json: not a readable verifier contract"):
        prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(tiny_verifier_dir)))


def test_online_training_refuses_another_verifier_before_loading_it(
        tmp_path, prompts, tiny_verifier_dir, monkeypatch):
    """``train --online`` runs the verifier itself (no extract): it is checked against the run's
    contract the same way, before the model is loaded."""
    import specdraft.core.verifier as verifier_mod
    from specdraft.train.config import TrainConfig
    from specdraft.train.run import run as train
    from specdraft.vocab.config import VocabConfig
    from specdraft.vocab.run import run as vocab

    run_dir = tmp_path / "run"
    _generate(run_dir, prompts, tiny_verifier_dir)
    prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(tiny_verifier_dir)))
    vocab(VocabConfig(run_dir=str(run_dir), draft_vocab_size=64))
    other = _reseeded_copy(tiny_verifier_dir, tmp_path / "other")
    monkeypatch.setattr(verifier_mod, "load_verifier", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("the verifier was loaded before the contract was checked")))
    with pytest.raises(ConfigError, match=r"train was given: another model \(weights"):
        train(TrainConfig(run_dir=str(run_dir), online=True, verifier=str(other), max_steps=1,
                          device="cpu"))


def test_later_stages_read_the_run_s_record_from_verifier_json(
        tmp_path, prompts, template, tiny_verifier_dir):
    """One reader (:func:`verifier_contract.run_verifier`) gives train, export, eval and doctor
    the profile, chat format and identity of ``RUN/verifier.json``; only a run without one falls
    back to RUN/extract's manifest and RUN/prepare/chat_format.json. Planted (by hand, undone):
    train's profile taken from the extract manifest again, and eval's chat format from
    ``RUN/prepare/chat_format.json``: both caught below (the edited contract is not what they
    return)."""
    from types import SimpleNamespace

    from specdraft.core.chat import ChatFormat
    from specdraft.core.manifest import load_stage_manifest
    from specdraft.core.profile import VerifierProfile
    from specdraft.eval.prompts import eval_chat_format
    from specdraft.train.run import verifier_identity, verifier_profile

    run_dir = tmp_path / "run"
    _generate(run_dir, prompts, tiny_verifier_dir, chat_template=str(template))
    prepare(PrepareConfig(run_dir=str(run_dir), verifier=str(tiny_verifier_dir)))
    extract(ExtractConfig(run_dir=run_dir, verifier=str(tiny_verifier_dir), aux_layers=(1, 2, 3)))
    held = verifier_contract.load(run_dir)
    record = verifier_contract.run_verifier(run_dir)
    assert record.source == "RUN/verifier.json"
    assert record.profile == VerifierProfile.from_dict(held.profile)
    assert (record.chat, record.identity) == (held.chat, held.identity)
    assert record.profile.n_layers == 4 and record.chat.template_sha256 == \
        _sha(template.read_text())

    # the contract is the source: an edit to it is what every stage reads
    edited_chat = held.chat.model_copy(update={"template_sha256": "e" * 64})
    edited = held.model_copy(update={"profile": {**held.profile, "rms_norm_eps": 0.125},
                                     "chat": edited_chat,
                                     "identity": {**held.identity, "path": "edited"}})
    (run_dir / "verifier.json").write_text(edited.model_dump_json())
    extract_manifest = load_stage_manifest(run_dir / "extract")
    assert extract_manifest.profile.rms_norm_eps != 0.125
    cfg = SimpleNamespace(run_dir=run_dir, verifier=None, online=False)
    assert verifier_profile(cfg, None, extract_manifest).rms_norm_eps == 0.125        # train
    assert verifier_identity(cfg, extract_manifest)["path"] == "edited"              # train
    ev = SimpleNamespace(run_dir=run_dir, chat_template=None, chat_template_kwargs=None)
    assert eval_chat_format(ev, None).template_sha256 == "e" * 64                    # eval
    assert ChatFormat.load(run_dir / "prepare" / "chat_format.json").template_sha256 == \
        _sha(template.read_text())

    # a run without verifier.json: RUN/extract's profile and identity, RUN/prepare's chat
    (run_dir / "verifier.json").unlink()
    fallback = verifier_contract.run_verifier(run_dir)
    assert fallback.source == "RUN/extract/manifest.json"
    assert fallback.profile == extract_manifest.profile
    assert fallback.identity == extract_manifest.verifier_identity
    assert fallback.chat.template_sha256 == _sha(template.read_text())
    assert verifier_contract.run_verifier(None).profile is None
