"""encode_turn on the real SmolLM2 tokenizer (+ <think>/</think>): masks checked by hand."""

from __future__ import annotations

import pytest

from specdraft.core.chat import Renderer, detect_stop_ids, message_reasoning, resolve_think_tokens
from specdraft.prepare.turns import Rules, Turn, TurnRejected, encode_turn

SYSTEM = {"role": "system", "content": "You are terse."}
THINK, END_THINK, IM_END, IM_START = 49152, 49153, 2, 1


@pytest.fixture(scope="module")
def renderer(think_tokenizer, think_template):
    return Renderer(think_tokenizer, think_template)


def rules_for(renderer, max_seq_len=512):
    think = resolve_think_tokens(renderer.tokenizer, None)
    return Rules(stop_ids=frozenset(detect_stop_ids(renderer, None)), think=think[0],
                 max_seq_len=max_seq_len, reasoning_format="{reasoning}\n{close}\n\n")


def turn(messages, index=None, *, kwargs=None, tools=None, finish="stop", ids=None):
    index = len(messages) - 1 if index is None else index
    return Turn(messages=messages, message_index=index,
                reasoning=message_reasoning(messages[index]), finish_reason=finish,
                completion_token_ids=ids, tools=tools, kwargs=kwargs or {})


def split(renderer, enc):
    """(unsupervised text, supervised text) of an encoded row."""
    ids, mask = enc.input_ids, enc.loss_mask
    return (renderer.decode([i for i, m in zip(ids, mask) if not m]),
            renderer.decode([i for i, m in zip(ids, mask) if m]))


def test_detected_tokens(renderer):
    assert resolve_think_tokens(renderer.tokenizer, None) == (("<think>", "</think>"),
                                                             (THINK, END_THINK))
    assert detect_stop_ids(renderer, None) == [IM_END]


def test_reasoning_turn_mask_by_hand(renderer):
    msgs = [SYSTEM, {"role": "user", "content": "What is 2*3?"},
            {"role": "assistant", "content": "6", "reasoning": "Let me think step by step."}]
    enc = encode_turn(renderer, turn(msgs), rules_for(renderer))
    tokens = renderer.tokenizer.convert_ids_to_tokens(enc.input_ids)
    # Written out by hand: system, user and the assistant header are the prompt (mask 0) ...
    prompt = ["<|im_start|>", "system", "Ċ", "You", "Ġare", "Ġter", "se", ".", "<|im_end|>", "Ċ",
              "<|im_start|>", "user", "Ċ", "What", "Ġis", "Ġ", "2", "*", "3", "?", "<|im_end|>",
              "Ċ", "<|im_start|>", "ass", "istant", "Ċ"]
    # ... then reasoning in think tokens, the answer and <|im_end|> (mask 1); the template's
    # trailing "\n" after <|im_end|> is never generated, so it is not in the row.
    completion = ["<think>", "Ċ", "Let", "Ġme", "Ġthink", "Ġstep", "Ġby", "Ġstep", ".", "Ċ",
                  "</think>", "Ċ", "Ċ", "6", "<|im_end|>"]
    assert tokens == prompt + completion
    assert enc.loss_mask == [0] * len(prompt) + [1] * len(completion)
    assert sum(enc.loss_mask) == 15
    span = "<think>\nLet me think step by step.\n</think>\n\n6<|im_end|>"
    assert sum(enc.loss_mask) == len(renderer.encode(span))
    assert split(renderer, enc)[1] == span
    assert not enc.truncated and enc.scaffold is None


def test_rewriting_template_is_rejected(think_tokenizer, think_template):
    # upper-cases the last message: the user text differs between prompt and full render
    upper = think_template.replace("+ m.content + '<|im_end|>\\n'",
                                   "+ (m.content | upper if loop.last else m.content) "
                                   "+ '<|im_end|>\\n'")
    assert upper != think_template
    r = Renderer(think_tokenizer, upper)
    msgs = [SYSTEM, {"role": "user", "content": "Who are you?"},
            {"role": "assistant", "content": "I am a model."}]
    with pytest.raises(TurnRejected) as err:
        encode_turn(r, turn(msgs), rules_for(r))
    assert err.value.reason == "template_mismatch"


def _two_turns():
    return [SYSTEM, {"role": "user", "content": "Who are you?"},
            {"role": "assistant", "content": "I am a model."},
            {"role": "user", "content": "What is your name?"},
            {"role": "assistant", "content": "My name is Q."}]


def test_enable_thinking_false_uses_generation_prompt(renderer):
    msgs, kw = _two_turns(), {"enable_thinking": False}
    for index, answer, first in ((2, "I am a model.", "I"), (4, "My name is Q.", "My")):
        enc = encode_turn(renderer, turn(msgs, index, kwargs=kw), rules_for(renderer))
        prompt = renderer.tokenizer.apply_chat_template(
            msgs[:index], tokenize=False, add_generation_prompt=True, enable_thinking=False)
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert enc.input_ids[:enc.n_prompt] == renderer.encode(prompt)
        assert split(renderer, enc) == (prompt, answer + "<|im_end|>")
        # the prompt ends with one "\n\n" token (what the server feeds), while "\n\n" before
        # a word tokenizes as two "\n": the completion is tokenized apart from the prompt
        tokens = renderer.tokenizer.convert_ids_to_tokens(enc.input_ids)
        assert tokens[enc.n_prompt - 2:enc.n_prompt + 1] == ["</think>", "ĊĊ", first]
        assert enc.scaffold == "prompt_boundary"


def test_empty_think_block_scaffold(think_tokenizer, think_template):
    # a template that renders the think block only when there is reasoning: the generation
    # prompt (enable_thinking=false) holds an empty block that the rendered turn lacks
    lean = think_template.replace("{%- if loop.index0 > st.q -%}",
                                  "{%- if loop.index0 > st.q and m.reasoning_content -%}")
    r = Renderer(think_tokenizer, lean)
    msgs, kw = _two_turns(), {"enable_thinking": False}
    enc = encode_turn(r, turn(msgs, kwargs=kw), rules_for(r))
    assert enc.scaffold == "empty_think_block+prompt_boundary"
    prompt, supervised = split(r, enc)
    assert prompt.endswith("What is your name?<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
                           "</think>\n\n")
    assert supervised == "My name is Q.<|im_end|>"
    msgs[4] = dict(msgs[4], reasoning="I should answer.")
    with pytest.raises(TurnRejected, match="template_mismatch"):
        encode_turn(r, turn(msgs, kwargs=kw), rules_for(r))


def test_a_templates_empty_think_block_before_an_answer_is_counted(renderer):
    """The thinking template in its default mode renders an answer without reasoning as
    "<think>\n\n</think>\n\n" + answer after a plain generation prompt: that block is
    supervised as generated, so the row names it (scaffold empty_think_scaffold, counted in
    the manifest's scaffolds); with reasoning the row has no scaffold."""
    msgs = [SYSTEM, {"role": "user", "content": "Who are you?"},
            {"role": "assistant", "content": "I am a model."}]
    enc = encode_turn(renderer, turn(msgs), rules_for(renderer))
    assert enc.scaffold == "empty_think_scaffold"
    assert split(renderer, enc)[1] == "<think>\n\n</think>\n\nI am a model.<|im_end|>"
    msgs[2] = dict(msgs[2], reasoning="Say who.")
    assert encode_turn(renderer, turn(msgs), rules_for(renderer)).scaffold is None


def test_think_opener_in_generation_prompt(think_tokenizer):
    # DeepSeek-R1 style: the generation prompt ends with "<think>\n"; turns drop reasoning
    r1 = ("{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + "
          "'<|im_end|>\\n' -}}{%- endfor -%}"
          "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n<think>\\n' -}}{%- endif -%}")
    r = Renderer(think_tokenizer, r1)
    msgs = [{"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Add them."}]
    enc = encode_turn(r, turn(msgs), rules_for(r))
    assert enc.scaffold == "think_opener"
    assert split(r, enc) == ("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n",
                             "Add them.\n</think>\n\n4<|im_end|>")
    assert enc.input_ids[enc.n_prompt - 2] == THINK  # the opener is a prompt token: no loss


def test_tool_call_turns(renderer):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    msgs = [SYSTEM, {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
            {"role": "assistant", "content": "It is 21°C."}]
    rules = rules_for(renderer)
    first = encode_turn(renderer, turn(msgs, 2, tools=tools), rules)
    second = encode_turn(renderer, turn(msgs, 4, tools=tools), rules)
    call_text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                 '</tool_call><|im_end|>')
    p1, s1 = split(renderer, first)
    assert '"name": "get_weather"' in p1  # the schema is in the prompt, unsupervised
    assert s1 == "<think>\n\n</think>\n\n" + call_text
    p2, s2 = split(renderer, second)
    assert s2 == "<think>\n\n</think>\n\nIt is 21°C.<|im_end|>"
    assert call_text in p2 and '{"temp": 21}' in p2  # history: call and result, both mask 0
    full = renderer.decode(second.input_ids)
    assert "get_weather" in full and '{"city": "Paris"}' in full


def test_completion_token_ids_verbatim(renderer):
    msgs = [SYSTEM, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x"}]
    ids = [THINK, 198, END_THINK, 198, 198, 28, IM_END]
    enc = encode_turn(renderer, turn(msgs, ids=ids), rules_for(renderer))
    assert enc.input_ids[enc.n_prompt:] == ids and enc.scaffold == "token_ids"
    assert enc.loss_mask == [0] * enc.n_prompt + [1] * len(ids)


def test_lengths(renderer):
    msgs = [SYSTEM, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "one two three four five"}]
    full = encode_turn(renderer, turn(msgs), rules_for(renderer))
    n_prompt, n_comp = full.n_prompt, sum(full.loss_mask)
    cut = encode_turn(renderer, turn(msgs), rules_for(renderer, n_prompt + 3))
    assert cut.truncated and cut.input_ids == full.input_ids[:n_prompt + 3]
    assert sum(cut.loss_mask) == 3 < n_comp
    with pytest.raises(TurnRejected, match="too_long"):
        encode_turn(renderer, turn(msgs), rules_for(renderer, n_prompt))
    # generation stopped by max_tokens: no stop token emitted, so none supervised
    stopped = encode_turn(renderer, turn(msgs, finish="length"), rules_for(renderer))
    assert stopped.truncated and stopped.input_ids == full.input_ids[:-1]


def test_reasoning_dropped_by_template(smollm2_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    r = Renderer(tok, tok.chat_template)
    msgs = [SYSTEM, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello", "reasoning": "Greet back."}]
    rules = Rules(stop_ids=frozenset([IM_END]), think=None, max_seq_len=256,
                  reasoning_format="{reasoning}\n{close}\n\n")
    with pytest.raises(TurnRejected, match="reasoning_dropped"):
        encode_turn(r, turn(msgs), rules)
