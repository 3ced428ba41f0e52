"""Eval renders its prompts with the run's chat format (template and chat_template_kwargs of the
training data), not the tokenizer's defaults; flags override it."""

from pathlib import Path

import pytest

from specdraft.core.chat import ChatFormat
from specdraft.eval.config import EvalConfig
from specdraft.eval.prompts import eval_chat_format, render

MESSAGES = [{"role": "user", "content": "Hi there"}]
EMPTY_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture
def run_without_thinking(tmp_path, think_tokenizer):
    """A run whose prepare stage rendered with enable_thinking=false."""
    fmt = ChatFormat.resolve(think_tokenizer, kwargs={"enable_thinking": False})
    fmt.save(tmp_path / "prepare")
    return tmp_path


def cfg(run_dir: Path | None, **kw) -> EvalConfig:
    return EvalConfig(run_dir=run_dir, prompts="builtin:demo_eval", out=run_dir or "/tmp/x",
                      drafter="/nonexistent", **kw)


def text(tok, ids):
    return tok.decode(ids)


def test_eval_uses_the_runs_template_kwargs(run_without_thinking, think_tokenizer):
    tok = think_tokenizer
    fmt = eval_chat_format(cfg(run_without_thinking), tok)
    assert fmt.kwargs == {"enable_thinking": False}
    rendered = text(tok, render(tok, MESSAGES, fmt))
    assert rendered == f"<|im_start|>user\nHi there<|im_end|>\n{EMPTY_THINK}"
    # the tokenizer's own rendering (what eval used before) lacks the empty think block
    plain = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert plain == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"


def test_flags_override_the_runs_format(run_without_thinking, think_tokenizer, tmp_path):
    tok = think_tokenizer
    fmt = eval_chat_format(cfg(run_without_thinking,
                               chat_template_kwargs='{"enable_thinking": true}'), tok)
    assert not text(tok, render(tok, MESSAGES, fmt)).endswith(EMPTY_THINK)
    other = tmp_path / "t.jinja"
    other.write_text("{% for m in messages %}[{{ m.content }}]{% endfor %}"
                     "{% if add_generation_prompt %}>{% endif %}")
    fmt = eval_chat_format(cfg(run_without_thinking, chat_template=str(other)), tok)
    assert text(tok, render(tok, MESSAGES, fmt)) == "[Hi there]>"
    assert fmt.kwargs == {"enable_thinking": False}  # the run's kwargs still apply


def test_standalone_eval_uses_the_tokenizer(think_tokenizer):
    tok = think_tokenizer
    fmt = eval_chat_format(cfg(None), tok)
    assert fmt.template == tok.chat_template and fmt.kwargs == {}
