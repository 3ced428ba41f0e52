"""Progress line and summary figures (by hand), and the CLI verb end to end."""

import io
import json

import typer
from typer.testing import CliRunner

from specdraft.generate.fakeserver import LoopbackServer
from specdraft.generate.progress import Progress, format_summary, progress_line


def test_progress_line_matches_the_issue_example():
    # 9850 samples in 18547 s: 0.531 req/s; 150 left / 0.531 = 282 s = 0.08 h
    assert progress_line(9850, 10000, 0, 18547.0, 9850 * 1941) == (
        "Progress: 9850/10000 (0 errors), 0.5 req/s, avg completion: 1941 tokens, "
        "elapsed: 18547s, ETA: 0.1h")


def test_progress_cadence_and_summary():
    now = [0.0]
    out = io.StringIO()
    p = Progress(4, interval_s=10, stream=out, clock=lambda: now[0])
    now[0] = 5
    # sample 1: prompt 20 tokens (ids 1..5 recur), completion 100; ids {1,2,3,4,5,9}
    p.update(reject=None, completion_tokens=100, reasoning=True, sequence_tokens=120,
             token_ids={1, 2, 3, 4, 5, 9})
    assert out.getvalue() == ""  # not due before 10 s
    now[0] = 10
    # sample 2: two turns, last prompt 150 + completion 200 = 350; ids {4, 5, 6, 7}
    p.update(reject=None, completion_tokens=300, reasoning=False, sequence_tokens=350,
             token_ids={4, 5, 6, 7})
    assert out.getvalue() == ("Progress: 2/4 (0 errors), 0.2 req/s, avg completion: 200 tokens, "
                              "elapsed: 10s, ETA: 0.0h\n")
    now[0] = 15
    p.update(reject="error", completion_tokens=0, reasoning=False)
    p.update(reject="truncated", completion_tokens=400, reasoning=True, sequence_tokens=420,
             token_ids={11, 12})  # skipped: its tokens count as work, not in the dataset
    assert out.getvalue().count("\n") == 1  # next line due at 20 s
    s = p.summary()
    # 4 finished in 15 s: 0.267 req/s; 800 completion tokens / 15 s = 53.3 tokens/s;
    # generated: 120 + 350 = 470 tokens, 100 + 300 = 400 response, means 235 and 200;
    # unique ids {1..7, 9} = 8
    assert s == {"finished": 4, "generated": 2, "tokenized": 2,
                 "rejected": {"error": 1, "truncated": 1}, "errors": 1,
                 "with_reasoning": 1, "with_reasoning_pct": 50.0, "completion_tokens": 800,
                 "completion_tokens_mean": 200.0, "total_tokens": 470, "response_tokens": 400,
                 "mean_seq_len": 235.0, "mean_response_len": 200.0, "unique_tokens": 8,
                 "elapsed_s": 15.0, "req_per_s": 0.267, "tokens_per_s": 53.3}
    text = format_summary(s)
    assert "generated: 2   tokenized: 2 (ids from the backend)   skipped: 2 (error=1, " \
           "truncated=1)   errors: 1" in text
    assert "with reasoning: 1 (50.0%)" in text
    assert "tokens: 470 total, 400 response   mean sequence 235.0, mean response 200.0   " \
           "unique: 8" in text
    assert "elapsed: 15.0s   0.27 req/s   53.3 tokens/s" in text


def _app():
    from specdraft.cli.generate import command

    app = typer.Typer()
    app.callback()(lambda: None)  # keep "generate" a sub-command even when it is the only one
    app.command("generate")(command)
    return app


def test_a_batch_that_finishes_together_is_printed_once_after_its_last_sample():
    """The local backend finishes 16 samples at once: the line counts all of them (before:
    "1/240 ... ETA 15.0h" printed at the batch's first sample, the other 15 already done)."""
    now = [0.0]
    out = io.StringIO()
    p = Progress(64, interval_s=30, stream=out, clock=lambda: now[0])
    now[0] = 200.0
    for _ in range(16):
        p.update(reject=None, completion_tokens=100, reasoning=False, emit=False)
    assert out.getvalue() == ""
    p.tick()
    # 16 done in 200 s: 0.08 req/s, 48 left: 600 s = 0.2 h
    assert out.getvalue() == ("Progress: 16/64 (0 errors), 0.1 req/s, avg completion: 100 "
                              "tokens, elapsed: 200s, ETA: 0.2h\n")


def test_cli_generate_with_config_file_and_refusal(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"question": "q1"}) + "\n" + json.dumps({"question": "q2"}))
    with LoopbackServer() as url:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"run_dir: {tmp_path / 'run'}\ngenerate:\n  backend: openai\n"
                       f"  endpoint: [{url}]\n  max_tokens: 16\n")
        args = ["generate", "--config", str(cfg), "--prompts", str(prompts), "--field",
                "question=question", "--chat-template-kwargs", '{"enable_thinking": false}']
        res = CliRunner().invoke(_app(), args)
        assert res.exit_code == 0, res.output
        assert "generate: 2 samples, rejected: none" in res.output
        again = CliRunner().invoke(_app(), args)
    assert "--resume" in str(again.exception)
    rec = json.loads((tmp_path / "run/generate/samples.jsonl").read_text().splitlines()[0])
    assert rec["chat_template_kwargs"] == {"enable_thinking": False}
    man = json.loads((tmp_path / "run/generate/manifest.json").read_text())
    assert man["config"]["max_tokens"] == 16 and man["counts"]["samples"] == 2


def test_cli_bad_json_flag_names_the_flag(tmp_path):
    res = CliRunner().invoke(_app(), ["generate", "--prompts", "x", "--run-dir", "r",
                                      "--chat-template-kwargs", "{oops"])
    assert "--chat-template-kwargs: not valid JSON" in str(res.exception)


def test_first_line_at_once_then_a_heartbeat_while_a_batch_runs():
    """Issue 40: the first progress line came after 182 s (the local backend's first batch).
    Now the run says what it does at once, and the heartbeat prints the line every interval
    while no sample finishes (a fake clock and a fake wait: no sleeping)."""
    now = [0.0]
    out = io.StringIO()
    p = Progress(64, interval_s=30, stream=out, clock=lambda: now[0])
    p._shown.write("generate: 64 prompts to answer (local backend)")
    assert out.getvalue() == "generate: 64 prompts to answer (local backend)\n"

    def wait(seconds):
        now[0] += seconds
        return now[0] > 95

    p._shown.heartbeat(wait)
    assert out.getvalue().splitlines()[1:] == [
        f"Progress: 0/64 (0 errors), 0.0 req/s, avg completion: 0 tokens, elapsed: {s}s, ETA: ?"
        for s in (30, 60, 90)]
    assert "\r" not in out.getvalue()
