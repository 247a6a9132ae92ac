"""Splitting a reasoning model's `<think>...</think>` text from its answer, whole or streamed.

The rule (Qwen3 and DeepSeek-R1 write `<think>\\nreasoning\\n</think>\\n\\nanswer`):

- `<think>` starts reasoning and `</think>` ends it. A tag that changes nothing (`<think>` while
  already in reasoning, `</think>` outside it) is dropped too: tag text never reaches either part.
- Reasoning is the text of every reasoning block joined, each block stripped of the newlines
  ("\\n") at its start and at its end. A block left open at the end of the output runs to the end.
  Empty reasoning is None.
- Content is everything else, joined, where the content that follows a `</think>` loses its
  leading newlines. Content before a `<think>` is kept as written.
- `starts_in_reasoning=True` is for prompts that end with an opened `<think>` (the template wrote
  it; see `prompt_starts_in_reasoning`): the output then begins inside a reasoning block.
"""

from __future__ import annotations

import re

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
_TAG = re.compile(f"{re.escape(THINK_OPEN)}|{re.escape(THINK_CLOSE)}")


def prompt_starts_in_reasoning(prompt_text: str) -> bool:
    """True when the rendered prompt (generation prompt included) ends with an opened `<think>`,
    so the model's output begins inside reasoning and only closes it with `</think>`.

    Qwen3 with enable_thinking=False renders `<think>\\n\\n</think>\\n\\n` (closed: False);
    templates that force thinking end with `<think>\\n` (True).
    """
    return prompt_text.rstrip().endswith(THINK_OPEN)


def split_reasoning(text: str, starts_in_reasoning: bool = False) -> tuple[str | None, str]:
    """(reasoning_content or None, content) of a whole output, by the rule in the module doc."""
    is_reasoning = starts_in_reasoning
    after_close = False  # the current content block follows a </think>
    reasoning: list[str] = []
    content: list[str] = []
    block: list[str] = []

    def end_block() -> None:
        text = "".join(block)
        if is_reasoning:
            reasoning.append(text.strip("\n"))
        else:
            content.append(text.lstrip("\n") if after_close else text)
        block.clear()

    pos = 0
    for match in _TAG.finditer(text):
        block.append(text[pos : match.start()])
        pos = match.end()
        opens = match.group() == THINK_OPEN
        if opens != is_reasoning:  # a tag that changes the state ends the block
            end_block()
            is_reasoning = opens
            after_close = not opens
    block.append(text[pos:])
    end_block()
    return "".join(reasoning) or None, "".join(content)


class ReasoningStream:
    """Splits an output arriving in deltas exactly as `split_reasoning` splits the whole of it.

    `feed(delta)` returns the (reasoning, content) text that is now certain; it holds back a
    suffix that may be the start of a tag (`<`, `<thi`, `</th`, ...) and newlines at the end of
    reasoning (dropped if `</think>` follows). `finish()` returns what was held back that the end
    of the output decides. For every way of cutting an output into deltas, the joined reasoning
    deltas equal `split_reasoning(...)[0] or ""` and the joined content deltas its `[1]`.
    """

    def __init__(self, starts_in_reasoning: bool = False) -> None:
        self.is_reasoning = starts_in_reasoning
        self._at_block_start = True  # strip leading newlines (reasoning, or content after </think>)
        self._is_first_block = not starts_in_reasoning  # the first content block keeps them
        self._pending = ""  # a suffix that may be the start of a tag
        self._held_newlines = 0  # newlines at the end of reasoning so far
        self._parts: list[tuple[bool, str]] = []  # (is_reasoning, text) not yet returned

    def feed(self, delta: str) -> tuple[str, str]:
        """Add `delta`; return the (reasoning delta, content delta) now known."""
        return _joined(self.feed_parts(delta))

    def finish(self) -> tuple[str, str]:
        """End of output: a held-back partial tag is text; newlines ending reasoning are dropped."""
        return _joined(self.finish_parts())

    def feed_parts(self, delta: str) -> list[tuple[bool, str]]:
        """As feed, in the output's order: (is_reasoning, text) parts, the kind alternating."""
        text = self._pending + delta
        self._pending = ""
        pos = 0
        while (lt := text.find("<", pos)) >= 0:
            self._add_text(text[pos:lt])
            rest = text[lt:]
            tag = next((t for t in (THINK_OPEN, THINK_CLOSE) if rest.startswith(t)), None)
            if tag is not None:
                self._add_tag(tag)
                pos = lt + len(tag)
            elif THINK_OPEN.startswith(rest) or THINK_CLOSE.startswith(rest):
                self._pending = rest  # may still become a tag
                pos = len(text)
            else:
                self._add_text("<")
                pos = lt + 1
        self._add_text(text[pos:])
        return self._take()

    def finish_parts(self) -> list[tuple[bool, str]]:
        """As finish, in the output's order (see feed_parts)."""
        pending, self._pending = self._pending, ""
        self._add_text(pending)
        self._held_newlines = 0
        return self._take()

    def _add_tag(self, tag: str) -> None:
        opens = tag == THINK_OPEN
        if opens == self.is_reasoning:
            return  # changes nothing: dropped
        self.is_reasoning = opens
        self._at_block_start = True
        self._is_first_block = False
        self._held_newlines = 0

    def _add_text(self, text: str) -> None:
        if self._at_block_start and not self._is_first_block:
            text = text.lstrip("\n")
        if not text:
            return
        self._at_block_start = False
        if not self.is_reasoning:
            self._add_part(False, text)
            return
        body = text.rstrip("\n")
        if body:
            self._add_part(True, "\n" * self._held_newlines + body)
            self._held_newlines = 0
        self._held_newlines += len(text) - len(body)

    def _add_part(self, is_reasoning: bool, text: str) -> None:
        if self._parts and self._parts[-1][0] == is_reasoning:
            text = self._parts.pop()[1] + text
        self._parts.append((is_reasoning, text))

    def _take(self) -> list[tuple[bool, str]]:
        parts, self._parts = self._parts, []
        return parts


def _joined(parts: list[tuple[bool, str]]) -> tuple[str, str]:
    """(reasoning, content) of ordered parts."""
    reasoning = "".join(text for is_reasoning, text in parts if is_reasoning)
    return reasoning, "".join(text for is_reasoning, text in parts if not is_reasoning)
