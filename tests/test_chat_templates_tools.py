"""Chat templates with tools and template variables: a two-step tool conversation renders in
each family's documented format, and chat_template_kwargs reach the template."""

from __future__ import annotations

import json

import pytest

from appliance.server.reasoning import prompt_starts_in_reasoning
from engine.text.tokenizer import apply_chat_template, render_chat_template
from tests.support.chat_templates import FORCED_THINKING, HERMES, LLAMA31, MISTRAL
from tests.support.tiny_models import byte_tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CALL = {
    "id": "call7abc9",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}
CONVERSATION = [
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call7abc9", "content": '{"temp_c": 4}'},
    {"role": "assistant", "content": "It is 4 C in Oslo."},
    {"role": "user", "content": "Thanks!"},
]
TOOL_JSON = json.dumps(WEATHER, ensure_ascii=False)


def _tokenizer(template: str):
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def _in_order(text: str, *parts: str) -> None:
    """Each part occurs in `text`, each after the one before."""
    pos = 0
    for part in parts:
        found = text.find(part, pos)
        assert found >= 0, f"{part!r} missing after position {pos} in:\n{text}"
        pos = found + len(part)


def test_hermes_two_step_tool_conversation():
    text = render_chat_template(_tokenizer(HERMES), CONVERSATION, tools=[WEATHER])
    _in_order(
        text,
        "<|im_start|>system\n",
        f"<tools>\n{TOOL_JSON}\n</tools>",
        "<|im_start|>user\nWeather in Oslo?<|im_end|>",
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Oslo"}}\n</tool_call><|im_end|>',
        '<|im_start|>user\n<tool_response>\n{"temp_c": 4}\n</tool_response><|im_end|>',
        "<|im_start|>assistant\nIt is 4 C in Oslo.<|im_end|>",
        "<|im_start|>user\nThanks!<|im_end|>\n<|im_start|>assistant\n",
    )
    assert text.endswith("<|im_start|>assistant\n")
    assert "None" not in text  # content=None of the calling turn is left out, not printed


def test_llama31_two_step_tool_conversation():
    tokenizer = _tokenizer(LLAMA31)
    text = render_chat_template(tokenizer, CONVERSATION, tools=[WEATHER])
    _in_order(
        text,
        "<s><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>\n\nAnswer with a JSON function call",
        f"{TOOL_JSON}\n\nWeather in Oslo?<|eot_id|>",
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", '
        '"parameters": {"city": "Oslo"}}<|eom_id|>',
        '<|start_header_id|>ipython<|end_header_id|>\n\n{"temp_c": 4}<|eot_id|>',
        "<|start_header_id|>assistant<|end_header_id|>\n\nIt is 4 C in Oslo.<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>\n\nThanks!<|eot_id|>",
    )
    assert text.count(TOOL_JSON) == 1  # tools go in the first user turn only
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_mistral_two_step_tool_conversation():
    text = render_chat_template(_tokenizer(MISTRAL), CONVERSATION, tools=[WEATHER])
    _in_order(
        text,
        "<s>[INST] Weather in Oslo?[/INST]",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}, '
        '"id": "call7abc9"}]</s>',
        '[TOOL_RESULTS] {"content": "{\\"temp_c\\": 4}", "call_id": "call7abc9"}[/TOOL_RESULTS]',
        " It is 4 C in Oslo.</s>",
        f"[AVAILABLE_TOOLS] [{TOOL_JSON}][/AVAILABLE_TOOLS][INST] Thanks![/INST]",
    )
    assert text.count("[AVAILABLE_TOOLS]") == 1  # before the last user turn only


@pytest.mark.parametrize("template", [HERMES, LLAMA31, MISTRAL])
def test_ids_are_the_rendered_text_and_messages_are_not_changed(template):
    tokenizer = _tokenizer(template)
    messages = json.loads(json.dumps(CONVERSATION))
    ids = apply_chat_template(tokenizer, messages, tools=[WEATHER])
    assert messages == CONVERSATION  # arguments stay a JSON string for the caller
    text = render_chat_template(tokenizer, messages, tools=[WEATHER])
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_without_tools_or_kwargs_the_template_renders_as_before():
    tokenizer = byte_tokenizer()  # the tests' plain template
    messages = [{"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render_chat_template(tokenizer, messages) == text == "<|user|>Hi\n<|assistant|>"
    assert apply_chat_template(tokenizer, messages) == tokenizer.encode(
        text, add_special_tokens=False
    )
    hermes = render_chat_template(_tokenizer(HERMES), messages)
    assert "<tools>" not in hermes and "<think>" not in hermes


def test_enable_thinking_reaches_the_template():
    messages = [{"role": "user", "content": "2+2?"}]
    qwen = _tokenizer(HERMES)
    off = render_chat_template(qwen, messages, template_kwargs={"enable_thinking": False})
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    on = render_chat_template(qwen, messages, template_kwargs={"enable_thinking": True})
    assert on.endswith("<|im_start|>assistant\n")
    assert not prompt_starts_in_reasoning(off) and not prompt_starts_in_reasoning(on)

    forced = _tokenizer(FORCED_THINKING)
    assert prompt_starts_in_reasoning(render_chat_template(forced, messages))
    no_think = render_chat_template(forced, messages, template_kwargs={"enable_thinking": False})
    assert not prompt_starts_in_reasoning(no_think)


def test_arguments_already_an_object_are_kept():
    call = {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    messages = [CONVERSATION[0], {"role": "assistant", "tool_calls": [call]}]
    text = render_chat_template(_tokenizer(HERMES), messages)
    assert '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in text


@pytest.mark.parametrize(
    "arguments, message",
    [("{city: Oslo}", "not valid JSON"), ("[1, 2]", "encode a list, not a JSON object")],
)
def test_bad_arguments_are_refused(arguments, message):
    call = {**CALL, "function": {"name": "get_weather", "arguments": arguments}}
    messages = [CONVERSATION[0], {"role": "assistant", "tool_calls": [call]}]
    with pytest.raises(ValueError, match=rf"messages\[1\].tool_calls.*{message}"):
        render_chat_template(_tokenizer(HERMES), messages)


@pytest.mark.parametrize("name", ["add_generation_prompt", "tokenize", "messages", "tools"])
def test_template_kwargs_may_not_set_the_servers_own_parameters(name):
    with pytest.raises(ValueError, match=f"may not set {name}"):
        render_chat_template(
            _tokenizer(HERMES), [{"role": "user", "content": "x"}], template_kwargs={name: 1}
        )


def test_no_template_is_a_clear_error():
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        apply_chat_template(tokenizer, [{"role": "user", "content": "x"}], tools=[WEATHER])


def test_the_fake_engines_tokenizer_takes_tools_and_variables():
    from tests.support.fake_engine import FakeTokenizer

    text = render_chat_template(
        FakeTokenizer(), CONVERSATION[:1], [WEATHER], {"enable_thinking": False}
    )
    assert text == "tools: get_weather enable_thinking: False user: Weather in Oslo? assistant:"
