"""A generate resume cannot drift: changed sampling parameters, chat template settings, model or
reasoning checks are refused naming the field (old → new); transport settings (endpoint,
concurrency, retries...) and ``--limit`` may change and are recorded."""

from __future__ import annotations

import io
import json

import pytest

from specdraft.core.errors import StageDirError
from specdraft.core.resume import SETTINGS_FILE
from specdraft.generate.fakeserver import LoopbackServer, vllm_reply
from specdraft.generate.run import run
from test_generate_openai import cfg, read_jsonl, write_prompts


async def echo(body):
    return vllm_reply(body)


@pytest.fixture
def started(tmp_path):
    """A run that answered the first 2 of 4 prompts (--limit 2)."""
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": f"p{i}", "prompt": f"q{i}"}
                                                   for i in range(4)])
    with LoopbackServer(echo) as url:
        run(cfg(tmp_path, url, prompts, limit=2, temperature=0.5, max_tokens=64),
            stream=io.StringIO())
    return tmp_path, prompts


@pytest.mark.parametrize("changed, message", [
    ({"temperature": 0.7}, "--temperature 0.5 → 0.7"),
    ({"max_tokens": 32}, "--max-tokens 64 → 32"),
    ({"top_p": 0.9, "seed": 3}, "--seed null → 3; --top-p 1.0 → 0.9"),
    ({"chat_template_kwargs": {"enable_thinking": False}},
     '--chat-template-kwargs {} → {"enable_thinking": false}'),
    ({"system_prompt": "Be brief."}, "--system-prompt null → 'Be brief.'"),
    ({"extra_body": {"top_k": 5}}, '--extra-body {} → {"top_k": 5}'),
])
def test_changed_setting_refused_naming_it(started, changed, message):
    tmp_path, prompts = started
    samples = (tmp_path / "run/generate/samples.jsonl").read_bytes()
    with LoopbackServer(echo) as url:
        kw = {"limit": 2, "temperature": 0.5, "max_tokens": 64, **changed}
        with pytest.raises(StageDirError) as err:
            run(cfg(tmp_path, url, prompts, resume=True, **kw), stream=io.StringIO())
    text = str(err.value)
    assert message in text and SETTINGS_FILE in text and "--overwrite" in text
    assert "\n" not in text
    assert (tmp_path / "run/generate/samples.jsonl").read_bytes() == samples


def test_allowed_changes_applied_and_recorded(started):
    tmp_path, prompts = started
    with LoopbackServer(echo) as url:  # a new server: another port, so another endpoint
        m = run(cfg(tmp_path, url, prompts, resume=True, limit=4, concurrency=3,
                    temperature=0.5, max_tokens=64), stream=io.StringIO())
    changes = m["resume_changes"]
    assert changes["limit"] == [2, 4] and changes["concurrency"][1] == 3
    assert set(changes) <= {"limit", "concurrency", "endpoint"}
    assert m["counts"]["already_done"] == 2 and m["counts"]["finished_this_run"] == 2
    assert sorted(r["id"] for r in read_jsonl(tmp_path / "run/generate/samples.jsonl")) == \
        ["p0", "p1", "p2", "p3"]
    stored = json.loads((tmp_path / "run/generate" / SETTINGS_FILE).read_text())
    assert stored["limit"] == 4 and m["config"]["limit"] == 4
