"""Chat templates written for the tests, one per documented tool-calling format, plus one that
opens a reasoning block itself. Each writes a call's arguments with `tojson`, so arguments that
reached it as a JSON string would show up quoted."""

from __future__ import annotations

HERMES = """\
{%- set ns = namespace(system='') %}
{%- if messages[0].role == 'system' %}{% set ns.system = messages[0].content %}{% endif %}
{%- if tools %}<|im_start|>system
{% if ns.system %}{{ ns.system }}

{% endif %}# Tools

Functions you may call, one JSON signature a line:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

Write each call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>
{% elif ns.system %}<|im_start|>system
{{ ns.system }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{{ m.content or '' }}
{%- for call in m.tool_calls or [] %}
<tool_call>
{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role != 'system' %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""
"""Hermes / Qwen style: tools listed in the system prompt inside <tools>, calls in <tool_call>,
results as a user turn in <tool_response>; `enable_thinking=False` writes an empty think block."""

LLAMA31 = """\
{{- bos_token }}<|start_header_id|>system<|end_header_id|>

Environment: ipython
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% endif %}<|eot_id|>
{%- set ns = namespace(tools_pending=tools is not none and tools | length > 0) %}
{%- for m in messages %}
{%- if m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- elif m.role == 'assistant' and m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for call in m.tool_calls -%}
{{ {'name': call.function.name, 'parameters': call.function.arguments} | tojson }}
{%- endfor %}<|eom_id|>
{%- elif m.role != 'system' %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{% if m.role == 'user' and ns.tools_pending %}{% set ns.tools_pending = false -%}
Answer with a JSON function call {"name": ..., "parameters": {...}} using one of:

{% for tool in tools %}{{ tool | tojson }}

{% endfor %}{% endif %}{{ m.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""
"""Llama 3.1 style: tools in the first user turn, a call as {"name", "parameters"} JSON ended by
<|eom_id|>, results in an ipython turn."""

MISTRAL = """\
{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
{%- endfor %}
{{- bos_token }}
{%- for m in messages %}
{%- if m.role == 'user' %}
{%- if tools and loop.index0 == ns.last_user %}[AVAILABLE_TOOLS] {{ tools | tojson }}\
[/AVAILABLE_TOOLS]{% endif %}[INST] {{ m.content }}[/INST]
{%- elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS] [
{%- for call in m.tool_calls %}
{{- {'name': call.function.name, 'arguments': call.function.arguments, 'id': call.id} | tojson }}
{%- if not loop.last %}, {% endif %}
{%- endfor %}]{{ eos_token }}
{%- elif m.role == 'assistant' %} {{ m.content }}{{ eos_token }}
{%- elif m.role == 'tool' %}[TOOL_RESULTS] \
{{ {'content': m.content, 'call_id': m.tool_call_id} | tojson }}[/TOOL_RESULTS]
{%- endif %}
{%- endfor %}"""
"""Mistral style: [AVAILABLE_TOOLS] before the last user turn, [TOOL_CALLS] a JSON list with
each call's id, [TOOL_RESULTS] naming the call_id it answers."""

FORCED_THINKING = """\
{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}
{% endfor %}
{%- if add_generation_prompt %}<|assistant|>
{%- if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""
"""Opens <think> in the generation prompt (the model's output begins inside reasoning) unless
enable_thinking is false."""
