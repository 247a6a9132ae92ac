"""Tokenizer loading, end-of-sequence ids and chat templating for a Hugging Face model folder."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.text import surrogates

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
"""tokenizer_config.json's tokenizer_class values that name transformers' generic class for a
tokenizer.json: loaded by that class directly, the result is what AutoTokenizer gives, without
importing AutoTokenizer's registry of every model (16 s of imports on the H200 test machine
against 2.3 s for the generic class alone)."""


def load_tokenizer(folder: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved in `folder` (local files only; never reaches the network)."""
    folder = Path(folder)
    config = _read_json(folder / "tokenizer_config.json")
    generic = config.get("tokenizer_class") in GENERIC_CLASSES
    try:
        if generic and (folder / "tokenizer.json").exists():
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"cannot load a tokenizer from {folder}: expected tokenizer.json (or the files of a "
            f"slow tokenizer) and tokenizer_config.json there ({e})"
        ) from e


def eos_token_ids(folder: str | Path, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Every token id that ends generation for this model.

    The union of the tokenizer's `eos_token_id` and the `eos_token_id` of generation_config.json
    and config.json (each may be missing, an int or a list: chat models often list the
    end-of-turn token there while the tokenizer names only the end-of-text one).
    """
    ids: set[int] = set()
    _add_ids(ids, getattr(tokenizer, "eos_token_id", None))
    for name in ("generation_config.json", "config.json"):
        data = _read_json(Path(folder) / name)
        _add_ids(ids, data.get("eos_token_id"))
        text_config = data.get("text_config")  # multimodal configs nest the language model's
        if isinstance(text_config, Mapping):
            _add_ids(ids, text_config.get("eos_token_id"))
    return frozenset(ids)


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase | None, prompt: str, add_special_tokens: bool = True
) -> list[int]:
    """Token ids of a text prompt; ValueError for a model without a tokenizer or for text that
    is not valid Unicode (a lone surrogate, which the tokenizer cannot take)."""
    if tokenizer is None:
        raise ValueError("this model has no tokenizer: pass prompts as token ids")
    surrogates.check(prompt, "the prompt")
    return list(tokenizer.encode(prompt, add_special_tokens=add_special_tokens))


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase | None,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of `messages` rendered with the model's chat template, ending with the prompt
    for the assistant's reply: `render_chat_template` encoded without added special tokens (the
    template writes any BOS itself).
    """
    text = render_chat_template(tokenizer, messages, tools, template_kwargs)
    surrogates.check(text, "the rendered chat prompt")  # a template's own text may hold one
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_chat_template(
    tokenizer: PreTrainedTokenizerBase | None,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The text of `messages` rendered with the model's chat template (add_generation_prompt).

    `tools`: OpenAI tool definitions (`{"type": "function", "function": {"name", "description",
    "parameters"}}`), handed to the template as transformers' `tools` variable unchanged.
    `template_kwargs`: extra template variables, such as `{"enable_thinking": False}`.
    With neither, the template is called exactly as before they existed.

    Messages are passed as OpenAI sends them (role "tool" with `tool_call_id`; assistant
    `tool_calls` of `{"id", "type": "function", "function": {"name", "arguments"}}`), with two
    changes that templates written for transformers expect: each call's `arguments` JSON string
    becomes the object it encodes (templates write it with `tojson` or iterate its items), and
    keys whose value is None (`"content": null` beside `tool_calls`) are left out.

    Raises:
        ValueError: the tokenizer has no chat template (a base model: send a plain prompt), a
            call's arguments are not a JSON object, a template variable is one of
            apply_chat_template's own parameters, or a string anywhere in the messages, tools
            or variables is not valid Unicode (a lone surrogate; named by its place, such as
            messages[0].content).
    """
    if tokenizer is None:
        raise ValueError("this model has no tokenizer, so chat messages cannot be formatted")
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"the tokenizer of {name} has no chat template, so chat messages cannot be formatted; "
            "use a completion prompt instead, or a chat (instruct) model"
        )
    for root, value in (
        ("messages", messages),
        ("tools", tools),
        ("chat_template_kwargs", template_kwargs),
    ):
        surrogates.check(value, root)
    extra: dict[str, Any] = dict(template_kwargs or {})
    reserved = sorted(set(extra) & _reserved_names(tokenizer))
    if reserved:
        raise ValueError(
            f"chat_template_kwargs may not set {', '.join(reserved)}: the server sets these "
            "itself; remove them from chat_template_kwargs"
        )
    if tools is not None:
        extra["tools"] = tools
    # Render then encode: what transformers does internally, without depending on its return
    # type across versions.
    return tokenizer.apply_chat_template(
        _template_messages(messages), tokenize=False, add_generation_prompt=True, **extra
    )


def _template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of `messages` as templates read them (see render_chat_template)."""
    out = []
    for i, message in enumerate(messages):
        message = {k: v for k, v in message.items() if v is not None}
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            message["tool_calls"] = [_template_call(call, i) for call in calls]
        out.append(message)
    return out


def _template_call(call: Any, index: int) -> Any:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError as e:
        raise ValueError(
            f"messages[{index}].tool_calls: the arguments of {function.get('name')!r} are not "
            f"valid JSON ({e}); send them as a JSON object encoded in a string"
        ) from e
    if not isinstance(arguments, dict):
        raise ValueError(
            f"messages[{index}].tool_calls: the arguments of {function.get('name')!r} encode a "
            f"{type(arguments).__name__}, not a JSON object; send an object such as '{{}}'"
        )
    return {**call, "function": {**function, "arguments": arguments}}


def _reserved_names(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """Template variable names that apply_chat_template takes as its own parameters."""
    params = inspect.signature(tokenizer.apply_chat_template).parameters
    names = {n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    return names | {"messages", "conversation", "conversations", "tools"}


def _add_ids(ids: set[int], value: Any) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        ids.add(value)
    elif isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping):
        ids.update(v for v in value if isinstance(v, int) and not isinstance(v, bool))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
