"""Tokenizer loading, end-of-sequence ids and chat templating for a Hugging Face model folder."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]
) -> list[int]:
    """Token ids of `messages` rendered with the model's chat template, ending with the prompt
    for the assistant's reply (add_generation_prompt=True).

    Raises:
        ValueError: the tokenizer has no chat template (a base model): send a plain prompt.
    """
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ValueError(
            f"the tokenizer of {name} has no chat template, so chat messages cannot be formatted; "
            "use a completion prompt instead, or a chat (instruct) model"
        )
    # Render then encode: the template writes any BOS itself, so none is added on top. This is
    # what transformers does internally, without depending on its return type across versions.
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


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
