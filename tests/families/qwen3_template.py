"""A Qwen3-style thinking chat template, written for these tests from the behaviour Qwen3's
``tokenizer_config.json`` template documents (our own text, not a copy):

- an optional system turn, and with ``tools`` a system block listing each tool as JSON inside
  ``<tools></tools>`` with the instruction to answer calls as ``<tool_call>{json}</tool_call>``;
- ``user`` turns as ``<|im_start|>user\\n…<|im_end|>\\n``; ``tool`` results folded into a user
  turn as ``<tool_response>\\n…\\n</tool_response>`` (consecutive results share one turn);
- an assistant turn's reasoning is ``reasoning_content``, else the text before ``</think>`` in
  its content (the content keeps what follows); it is rendered only for assistant turns after
  the last *real* user query (a user turn that is not a wrapped tool response), as
  ``<think>\\n{reasoning}\\n</think>\\n\\n{content}`` — for the last message always (an empty
  block when it has none), for earlier ones only when they have reasoning;
- the generation prompt is ``<|im_start|>assistant\\n``, followed by an empty think block
  ``<think>\\n\\n</think>\\n\\n`` when ``enable_thinking`` is false.
"""

QWEN3_TEMPLATE = r"""
{%- set ns = namespace(last_query=messages|length - 1, found=false) -%}
{%- for m in messages[::-1] -%}
  {%- set i = messages|length - 1 - loop.index0 -%}
  {%- if not ns.found and m.role == 'user' and m.content is string
        and not (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) -%}
    {%- set ns.found = true -%}{%- set ns.last_query = i -%}
  {%- endif -%}
{%- endfor -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages[0].role == 'system' -%}{{- messages[0].content + '\n\n' -}}{%- endif -%}
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and '
      'arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": '
      '<function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
  {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
  {%- set text = m.content if m.content is string else '' -%}
  {%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}
    {{- '<|im_start|>' + m.role + '\n' + text + '<|im_end|>\n' -}}
  {%- elif m.role == 'assistant' -%}
    {%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}
    {%- if not reasoning and '</think>' in text -%}
      {%- set reasoning = text.split('</think>')[0].split('<think>')[-1] -%}
      {%- set text = text.split('</think>')[-1] -%}
    {%- endif -%}
    {%- set reasoning = reasoning.strip('\n') -%}
    {%- set text = text.lstrip('\n') -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
      {{- '<think>\n' + reasoning + '\n</think>\n\n' -}}
    {%- endif -%}
    {{- text -}}
    {%- for c in (m.tool_calls or []) -%}
      {%- set f = c.function if c.function is defined else c -%}
      {%- if loop.first and text -%}{{- '\n' -}}{%- elif not loop.first -%}{{- '\n' -}}{%- endif -%}
      {{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' -}}
      {{- (f.arguments if f.arguments is string else f.arguments | tojson) + '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
      {{- '<|im_start|>user' -}}
    {%- endif -%}
    {{- '\n<tool_response>\n' + text + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
      {{- '<|im_end|>\n' -}}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}
    {{- '<think>\n\n</think>\n\n' -}}
  {%- endif -%}
{%- endif -%}
""".strip()
