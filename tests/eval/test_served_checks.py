"""`eval --server` checks the served model before measuring (issue #39, item 1): its name, its
max_model_len and its logprobs on stored rows against the stored teacher.

A tiny random Llama is extracted for real (RUN/extract rows + verifier head). The loopback
server (specdraft.generate.fakeserver) then answers ``/v1/completions`` with the top-5
log-probabilities of a real forward: of the verifier itself (right), of another random model
(wrong); and lists a right or wrong name and context. Each failure refuses the eval naming the
check; ``--allow-other-verifier`` records it; a check that cannot run says "not run".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
import torch

from specdraft.core.errors import ConfigError
from specdraft.generate.fakeserver import LoopbackServer, Reply, echo_handler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "extract"))

METRICS = ("vllm:spec_decode_num_drafts_total {d}\nvllm:spec_decode_num_draft_tokens_total {t}\n"
           "vllm:spec_decode_num_accepted_tokens_total {a}\n")


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_verifier_dir):
    from extract_helpers import random_rows, write_prepared
    from transformers import LlamaForCausalLM

    from specdraft.core.verifier import load_verifier
    from specdraft.extract.config import ExtractConfig
    from specdraft.extract.run import run as extract

    tmp = tmp_path_factory.mktemp("served")
    run = tmp / "run"
    ids, masks = random_rows([24, 30], vocab=2000, seed=0)
    write_prepared(run, ids, masks)
    extract(ExtractConfig(run_dir=run, verifier=str(tiny_verifier_dir), aux_layers=(1, 2, 3),
                          storage="bf16", batch_tokens=256))
    model = load_verifier(tiny_verifier_dir, dtype="float32")
    torch.manual_seed(1)
    other = LlamaForCausalLM(model.config).eval()  # another random init, same shapes
    prompts = tmp / "prompts.jsonl"
    prompts.write_text(json.dumps({"question": "What is 2+2?"}) + "\n")
    return {"tmp": tmp, "run": run, "verifier": tiny_verifier_dir, "prompts": prompts,
            "model": model, "other": other}


def routes(model):
    """``/v1/completions`` answered by ``model``'s real next-token distribution (vLLM's
    ``token_id:N`` spelling) and ``/metrics`` counters that grow with each chat request."""
    served = {"chats": 0}

    async def completions(method, raw):
        body = json.loads(raw)
        assert body["max_tokens"] == 1 and body["logprobs"] == 5
        with torch.no_grad():
            logits = model(torch.tensor([body["prompt"]])).logits[0, -1].double()
        top = torch.log_softmax(logits, -1).topk(5)
        lp = {f"token_id:{int(i)}": float(v) for v, i in zip(top.values, top.indices)}
        return Reply(200, {"choices": [{"text": "", "logprobs": {"top_logprobs": [lp]}}]})

    async def metrics(method, raw):
        n = served["chats"]
        return Reply(200, METRICS.format(d=2 * n, t=6 * n, a=3 * n).encode())

    async def chat(body):
        served["chats"] += 1
        return await echo_handler(body)

    return {"/v1/completions": completions, "/metrics": metrics}, chat


def _config(world, url, **kw):
    from specdraft.eval.config import EvalConfig

    return EvalConfig(server=url, prompts=world["prompts"], out=world["tmp"] / "unused", **kw)


def _check(world, model, *, name=None, max_model_len=2048, **kw):
    from specdraft.eval.served import check_served

    extra, chat = routes(model)
    with LoopbackServer(chat, model_name=name or str(world["verifier"]),
                        max_model_len=max_model_len, routes=extra) as url:
        return check_served(_config(world, url.removesuffix("/v1"), **kw),
                            httpx.Client(base_url=url.removesuffix("/v1")))


def test_the_right_server_passes_every_check(world):
    r = _check(world, world["model"], run_dir=world["run"])
    assert r["ok"] and not r["allowed_by_flag"]
    assert [c["status"] for c in (r["name"], r["max_model_len"], r["logprobs"])] == \
        ["passed"] * 3
    lp = r["logprobs"]
    assert lp["positions"] == 16 and lp["top1"] == 1.0  # 2 rows x 8 positions
    assert lp["mean_abs_diff"] < 0.01  # the teacher stored in bf16 against a fp32 forward
    # vLLM's `root` (the loaded path) with a short served name also names the verifier
    r = _check(world, world["model"], name="/models/" + world["verifier"].name,
               run_dir=world["run"])
    assert r["name"]["status"] == "passed"


def test_another_model_is_refused_by_its_logprobs(world):
    with pytest.raises(ConfigError, match=r"served logprobs: 16 stored positions.*top token = "
                                          r"the teacher's at 0\.\d\d of them.*not the one whose "
                                          r"teacher.*--allow-other-verifier"):
        _check(world, world["other"], run_dir=world["run"])
    r = _check(world, world["other"], run_dir=world["run"], allow_other_verifier=True)
    assert not r["ok"] and r["allowed_by_flag"] and r["logprobs"]["status"] == "failed"
    assert r["logprobs"]["top1"] < 0.4


def test_a_wrong_name_or_context_is_refused(world):
    with pytest.raises(ConfigError, match=r"serves 'someone/other-model'.*not the verifier"):
        _check(world, world["model"], name="someone/other-model", run_dir=world["run"])
    with pytest.raises(ConfigError, match=r"max_model_len 4096 is longer than the "
                                          r"max_position_embeddings 2048"):
        _check(world, world["model"], max_model_len=4096, run_dir=world["run"])
    with pytest.raises(ConfigError, match=r"max_model_len 16 is shorter than the 18 tokens"):
        _check(world, world["model"], max_model_len=16, run_dir=world["run"])


def test_checks_that_cannot_run_say_not_run(world):
    r = _check(world, world["model"], max_model_len=None)
    assert r["ok"] and {c["status"] for c in (r["name"], r["max_model_len"],
                                              r["logprobs"])} == {"not run"}
    assert "not checked (no --run-dir" in r["name"]["line"]
    assert "lists no max_model_len" in r["max_model_len"]["line"]
    # --verifier alone: the name and the context are checked, the logprobs are not
    r = _check(world, world["model"], verifier=str(world["verifier"]))
    assert (r["name"]["status"], r["max_model_len"]["status"], r["logprobs"]["status"]) == \
        ("passed", "passed", "not run")


def test_eval_server_refuses_before_measuring_and_records_the_checks(world):
    from specdraft.eval.config import EvalConfig
    from specdraft.eval.run import run as evaluate

    def serve(model):
        extra, chat = routes(model)
        return LoopbackServer(chat, model_name=str(world["verifier"]), max_model_len=2048,
                              routes=extra)

    def run_eval(url, out):
        evaluate(EvalConfig(server=url.removesuffix("/v1"), run_dir=world["run"],
                            prompts=world["prompts"], out=world["tmp"] / out))

    wrong = serve(world["other"])
    with wrong as url, pytest.raises(ConfigError, match="served logprobs"):
        run_eval(url, "s1")
    assert wrong.chat_bodies == []  # refused before a prompt was measured
    right = serve(world["model"])
    with right as url:
        run_eval(url, "s2")
    assert len(right.chat_bodies) == 1
    res = json.loads((world["tmp"] / "s2" / "results.json").read_text())
    assert res["served_model"]["ok"] and res["tau"] == pytest.approx(1 + 3 / 2)
    m = json.loads((world["tmp"] / "s2" / "manifest.json").read_text())
    assert m["served_model"]["logprobs"]["status"] == "passed"
