"""Reasoning extraction from canned chat-completion messages (hand-written expectations)."""

import pytest

from specdraft.generate.client import TurnOutput
from specdraft.artifacts.prompts import Prompt
from specdraft.core.reasoning import extract, split_inline
from specdraft.generate.samples import Checks, SampleState

R, A = "2+2 equals 4.", "The answer is 4."


@pytest.mark.parametrize("message,source", [
    ({"role": "assistant", "content": A, "reasoning": R}, "reasoning"),
    ({"role": "assistant", "content": A, "reasoning_content": R}, "reasoning_content"),
    ({"role": "assistant", "content": A, "reasoning": R, "reasoning_content": R}, "reasoning"),
    ({"role": "assistant", "content": f"<think>\n{R}\n</think>\n\n{A}"}, "inline"),
])
def test_four_shapes_give_one_reasoning_string(message, source):
    s = extract(message)
    assert (s.reasoning, s.content, s.source, s.problem) == (R, A, source, None)


def test_closer_only_when_opener_was_in_the_prompt():
    s = extract({"content": "2+2 equals 4.\n</think>\n\nThe answer is 4."})
    assert (s.reasoning, s.content, s.source, s.problem) == (R, A, "inline", None)


def test_no_tags_is_all_answer():
    s = extract({"content": "  The answer is 4.\n"})
    assert (s.reasoning, s.content, s.source, s.problem) == (None, A, "none", None)


def test_empty_reasoning_field_falls_back_to_inline():
    s = extract({"content": f"<think>{R}</think>{A}", "reasoning": "", "reasoning_content": None})
    assert (s.reasoning, s.content, s.source) == (R, A, "inline")


def test_two_closers_are_flagged():
    s = split_inline(f"{R}</think>half</think>{A}")
    assert s.problem == "2 </think> closers"
    assert (s.reasoning, s.content) == (R, f"half</think>{A}")


def test_opener_without_closer_is_flagged():
    s = split_inline(f"<think>{R} and still going")
    assert s.problem == "<think> opener without </think>"
    assert (s.reasoning, s.content) == (f"{R} and still going", "")


def test_differing_fields_keep_reasoning_and_flag():
    s = extract({"content": A, "reasoning": R, "reasoning_content": "other"})
    assert (s.reasoning, s.source) == (R, "reasoning")
    assert s.problem == "reasoning and reasoning_content differ; kept reasoning"


def test_custom_think_tags():
    s = extract({"content": f"[THINK]{R}[/THINK]{A}"}, open_tag="[THINK]", close_tag="[/THINK]")
    assert (s.reasoning, s.content, s.source) == (R, A, "inline")
    assert extract({"content": f"[THINK]{R}[/THINK]{A}"}).source == "none"


def _turn(content, finish="stop", **msg):
    return TurnOutput(message={"content": content, **msg}, finish_reason=finish,
                      usage={"completion_tokens": 7}, completion_token_ids=None,
                      prompt_token_ids=None, latency_s=0.1, endpoint="e", model="m")


@pytest.mark.parametrize("content,finish,checks,reason", [
    (f"{R}</think>x</think>{A}", "stop", Checks(), "malformed_think"),
    (f"<think>{R}", "stop", Checks(), "malformed_think"),
    (f"<think>{R}", "length", Checks(), "truncated"),
    (f"<think>{R}</think>", "stop", Checks(), "empty_answer"),
    (A, "stop", Checks(require_reasoning=True), "empty_reasoning"),
    (A, "stop", Checks(), None),
])
def test_turn_verdicts(content, finish, checks, reason):
    st = SampleState(Prompt(id="x", system=None, turns=("q",), source="f:1"))
    st.request()
    st.add(_turn(content, finish), checks)
    assert (st.reject[0] if st.reject else None) == reason
    assert st.done


def test_malformed_kept_when_asked_is_recorded_not_silent():
    st = SampleState(Prompt(id="x", system=None, turns=("q",), source="f:1"))
    st.request()
    st.add(_turn(f"{R}</think>x</think>{A}"), Checks(malformed_think="keep"))
    assert st.reject is None
    assert st.turns[0]["think_problem"] == "2 </think> closers"
