"""The MLA drafter trained by specdraft (``train --drafter-layer mla``) on the Kimi-K2.5-shaped
verifier (``tests/kimi_fixture.py`` with the think tokenizer, saved to disk; eval's worker loads a
tokenizer), exported by ``specdraft export --format vllm`` and served by the real engine through
eval's own worker (``specdraft.eval.engine``): one worker process, three ``vllm.LLM`` starts (the
export, no drafter, a planted layout fault). The engine must load it as
``Eagle3DeepseekV2ForCausalLM``, its greedy output must equal decoding without it, it must accept
what it memorised (the drafter overfits the verifier's own greedy answers to the same prompts),
and the offline loop on the same prompt ids must count exactly what vLLM counted (float32)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from engine_kit import offline_greedy  # noqa: E402
from kimi_fixture import kimi_config  # noqa: E402
from memsource import MemorySource, greedy_corpus, write_vocab  # noqa: E402

pytestmark = pytest.mark.slow
PROMPT, K, NEW = 6, 3, 30
#: Chat prompts ``eval --engine vllm`` renders with the verifier's thinking template; the drafter
#: memorises the verifier's greedy answers to them too, so the end-to-end eval accepts tokens.
QUESTIONS = ["What is 7 times 8?", "Name a prime above 20.", "Spell cat backwards.",
             "Is the sea salty?"]


def chat_corpus(verifier, tokenizer, questions: list[str], gen_len: int):
    """``[(id, ids, loss_mask)]``: each question rendered as eval renders it
    (:func:`specdraft.eval.prompts.render` in the format eval resolves without a run), then the
    verifier's greedy continuation (loss-masked)."""
    from types import SimpleNamespace

    from specdraft.eval.prompts import eval_chat_format, render

    fmt = eval_chat_format(SimpleNamespace(run_dir=None, chat_template=None,
                                           chat_template_kwargs=None), tokenizer)
    out = []
    for i, q in enumerate(questions):
        prompt = render(tokenizer, [{"role": "user", "content": q}], fmt)
        ids = verifier.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                dtype=torch.long), do_sample=False, max_new_tokens=gen_len,
                                min_new_tokens=gen_len, pad_token_id=0)[0].tolist()
        out.append((f"chat{i}/0", ids, [0] * len(prompt) + [1] * gen_len))
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory, vllm_python, think_tokenizer_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdraft.eval.engine import run_worker, vllm_job
    from specdraft.export.config import ExportConfig
    from specdraft.export.run import run as export
    from specdraft.artifacts.drafter import load_drafter
    from specdraft.train.config import TrainConfig
    from specdraft.train.run import run

    root = tmp_path_factory.mktemp("kimi_mla")
    tok = AutoTokenizer.from_pretrained(think_tokenizer_dir)
    torch.manual_seed(0)
    verifier = AutoModelForCausalLM.from_config(kimi_config(len(tok))).eval()
    with torch.no_grad():
        verifier.lm_head.weight.mul_(30.0)  # a peaked teacher
    verifier.save_pretrained(root / "verifier")
    tok.save_pretrained(root / "verifier")
    corpus = greedy_corpus(verifier, 8, prompt_len=PROMPT, gen_len=NEW, vocab_range=2000)
    chats = chat_corpus(verifier, tok, QUESTIONS, NEW)
    write_vocab(root / "run", corpus + chats, len(tok))
    run(TrainConfig(run_dir=root / "run", drafter_layer="mla", epochs=500, max_steps=120,
                    ttt_steps=K,
                    lr=1e-2, warmup_steps=2, batch_tokens=36 * 8, val_fraction=0.0,
                    eval_every=1000, save_every=1000, log_every=10, dtype="float32",
                    teacher_check=False), verifier=verifier,
        source=MemorySource(verifier, corpus + chats))
    drafter = load_drafter(root / "run" / "train" / "last")
    export(ExportConfig(drafter=root / "run" / "train" / "last", out=root / "export",
                        format="vllm", verifier=str(root / "verifier"),
                        aux_layers=tuple(drafter.config.aux_layer_ids)))
    config = json.loads((root / "export" / "config.json").read_text())
    tensors = load_file(str(root / "export" / "model.safetensors"))
    # planted: kv_a_proj_with_mqa's rows in the other order (rope key first, then the latent),
    # the split a wrong reading of the layout would write
    w = tensors["midlayer.self_attn.kv_a_proj_with_mqa.weight"]
    lat = config["kv_lora_rank"]
    bad = {**tensors, "midlayer.self_attn.kv_a_proj_with_mqa.weight":
           torch.cat([w[lat:], w[:lat]]).contiguous()}
    (root / "planted").mkdir()
    (root / "planted" / "config.json").write_text(json.dumps(config, indent=2))
    save_file(bad, str(root / "planted" / "model.safetensors"), metadata={"format": "pt"})
    job = vllm_job(verifier_dir=root / "verifier", drafter_dir=root / "export",
                   prompts=[ids[:PROMPT] for _, ids, _ in corpus], k=K, temperature=0.0,
                   max_tokens=NEW, stop_ids=[], dtype="float32",
                   extra_runs=[{"name": "plain", "drafter": None, "k": 0},
                               {"name": "planted", "drafter": str(root / "planted"), "k": K}])
    return run_worker(vllm_python, job, root / "engine", timeout_s=900), root, verifier, corpus


def test_vllm_serves_the_mla_drafter(served):
    from specdraft.eval.engine import figures

    res, root, _, _ = served
    log = (root / "engine" / "engine.log").read_text()
    assert "Resolved architecture: Eagle3DeepseekV2ForCausalLM" in log
    spec, plain = res["runs"][0], res["runs"][1]
    assert spec["tokens"] == plain["tokens"]  # the drafter never changes greedy output
    fig = figures(spec["counters"])
    print(json.dumps({k: fig[k] for k in ("tau", "acceptance_rate", "per_position")}))
    # measured 0.78 / 2.79 (it memorises the chat prompts' answers too); planted: 0.01 / 1.01
    assert fig["per_position"][0] >= 0.7 and fig["tau"] >= 2.5, fig
    planted = figures(res["runs"][2]["counters"])
    print(json.dumps({k: planted[k] for k in ("tau", "acceptance_rate", "per_position")}))
    assert res["runs"][2]["tokens"] == plain["tokens"]
    assert planted["tau"] < fig["tau"] - 0.5, (planted, fig)


def test_offline_counts_equal_the_engine_on_the_export(served):
    """The exported directory read back (:func:`specdraft.artifacts.drafter.read_drafter`, the
    reader eval uses) and decoded by the offline loop on the prompt ids the engine got: the same
    verify steps, drafts, acceptances per position and committed tokens."""
    res, root, verifier, corpus = served
    off, tokens = offline_greedy(verifier, root / "export", [ids[:PROMPT] for _, ids, _ in corpus],
                                 K, NEW)
    c = res["runs"][0]["counters"]
    assert (c["drafts"], c["draft_tokens"], c["accepted"], c["per_pos"]) == (
        off["verify_steps"], off["drafted"], off["accepted"], off["per_position_accepted"])
    assert tokens == res["runs"][0]["tokens"]


def test_eval_engine_vllm_end_to_end_on_the_mla_family(served, vllm_python):
    """``specdraft eval --engine vllm`` on this family, as a user runs it: the training directory
    of the MLA drafter and the verifier directory; eval exports the drafter in the one format
    vLLM serves for it (``vllm``), serves it in the real engine on prompts rendered by the
    verifier's thinking template, and the offline loop counts exactly what vLLM counted (verify
    steps, drafts, accepted per position, every prompt's tokens; float32), τ gap 0."""
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import run as evaluate

    _, root, _, _ = served
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}]}) + "\n"
                               for q in QUESTIONS))
    out = root / "eval"
    evaluate(EvalConfig(drafter=root / "run" / "train" / "last", verifier=str(root / "verifier"),
                        prompts=prompts, k=K, max_new_tokens=24, dtype="float32",
                        engine="vllm", engine_python=vllm_python, engine_timeout_s=900,
                        out=out))
    res = json.loads((out / "results.json").read_text())
    e, agree = res["engine"], res["engine"]["agreement"]
    print(json.dumps({"offline_tau": res["tau"], "engine_tau": e["tau"],
                      "per_position": e["per_position"]}))
    assert e["name"] == "vllm" and e["version"].startswith("vllm 0.32") and e["dtype"] == "float32"
    assert Path(e["drafter_dir"]) == out / "engine-drafter"
    exported = json.loads((out / "engine-drafter" / "config.json").read_text())
    assert exported["architectures"] == ["Eagle3DeepseekV2ForCausalLM"]
    assert "Resolved architecture: Eagle3DeepseekV2ForCausalLM" in \
        "".join(p.read_text(errors="replace") for p in out.rglob("*.log"))
    for name in ("verify_steps", "drafted", "accepted", "per_position_accepted"):
        assert e[name] == res[name], name
    assert agree["counts_identical"] and agree["tau_offline_minus_engine"] == 0.0
    assert agree["identical_prompts"] == len(QUESTIONS)
    assert e["drafted"] == K * e["verify_steps"]
    assert e["per_position"][0] >= 0.5 and e["tau"] >= 2.0, e  # it accepts what it memorised
