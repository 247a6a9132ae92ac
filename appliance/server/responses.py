"""OpenAI response bodies: completion and chat objects, stream chunks, logprobs, usage.

The bodies follow the models in appliance.server.schema.responses (tests validate them there).
Stream chunks are written from a per-request serialised envelope plus the one choice that
changed; a token that brings only text (most of them) costs one json.dumps of that text.
"""

from __future__ import annotations

import json

from aiohttp import web

from appliance.server.chat_output import ChatOutput
from appliance.server.generation import Choice
from engine.scheduling.request import Logprob

_PROBE_INDEX = 918273645
_PROBE_TEXT = "\x00probe"
"""Placeholders no real choice holds, replaced by %d and %s to make the text-only template."""


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


async def send_event(resp: web.StreamResponse, payload: dict | str) -> None:
    """One SSE event; a str payload is sent as it is (serialised JSON, or "[DONE]")."""
    data = payload if isinstance(payload, str) else dumps(payload)
    await resp.write(f"data: {data}\n\n".encode())


def _finite(logprob: float) -> float:
    """JSON has no -Infinity: a token the model rules out gets a very low finite logprob."""
    return logprob if logprob > -9999.0 else -9999.0


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """OpenAI's usage object; `cached_tokens` are the prompt tokens the prefix cache held."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class Formatter:
    """Builds the bodies of one request (completions or chat); knows ids, model and tokenizer."""

    def __init__(
        self,
        endpoint: str,
        request_id: str,
        model: str,
        created: int,
        tokenizer,
        chat_output: ChatOutput | None = None,
    ) -> None:
        self.chat = endpoint == "chat"
        self.chat_output = chat_output if chat_output and not chat_output.is_plain else None
        """How chat text splits into reasoning, content and tool calls; None: all content."""
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{request_id}"
        self.model = model
        self.created = created
        self.tokenizer = tokenizer
        envelope = dumps(self._envelope([], chunk=True))
        self._chunk_head = envelope[: -len("]}")]
        """A serialised chunk up to its choices array's opening bracket."""
        # Most tokens bring text only: their choice is this template (%d the index, %s the JSON
        # string), made from the general item so that the two cannot differ.
        probe = dumps(self._delta_item(_PROBE_INDEX, _PROBE_TEXT, None, None))
        self._text_item = probe.replace(str(_PROBE_INDEX), "%d").replace(dumps(_PROBE_TEXT), "%s")

    def _envelope(self, choices: list[dict], chunk: bool) -> dict:
        if self.chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    # --- whole responses ----------------------------------------------------------------
    def full(self, choices: list[Choice], usage_: dict) -> dict:
        out = []
        for c in choices:
            last = c.last
            text = last.text if last is not None else ""
            lps = (
                self.logprobs(last.logprobs or [], 0)
                if last and last.logprobs is not None
                else None
            )
            item: dict = {"index": c.record.index, "logprobs": lps}
            reason = c.record.finish_reason
            if self.chat_output is not None:
                item["message"], has_calls = self.chat_output.message(text)
                reason = "tool_calls" if has_calls and reason != "length" else reason
            elif self.chat:
                item["message"] = {"role": "assistant", "content": text}
            else:
                item["text"] = text
            item["finish_reason"] = reason
            item["stop_reason"] = last.stop_reason if last is not None else None
            out.append(item)
        return {**self._envelope(out, chunk=False), "usage": usage_}

    # --- streaming: serialised chunks ---------------------------------------------------
    def _chunk(self, choice: str, with_usage: bool, usage_: str = "null") -> str:
        """A chunk around one serialised choice (or none); "usage" only when asked for."""
        tail = f'],"usage":{usage_}}}' if with_usage else "]}"
        return f"{self._chunk_head}{choice}{tail}"

    def role_chunk(self, index: int, with_usage: bool) -> str:
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._chunk(dumps(choice), with_usage)

    def _delta_item(self, index: int, text: str, lps: dict | None, out) -> dict:
        """A choice of a chunk; `out` is the finished output, or None while it runs."""
        item: dict = {"index": index, "logprobs": lps, "finish_reason": None}
        if out is not None:
            item["finish_reason"] = out.finish_reason
        if self.chat:
            item["delta"] = {"content": text} if text or out is None else {}
        else:
            item["text"] = text
        if out is not None:
            item["stop_reason"] = out.stop_reason
        return item

    def delta_chunk(self, c: Choice, with_usage: bool) -> str | None:
        """The next chunk of a choice (new text/logprobs, or its finish), or None if nothing new."""
        out = c.last
        text = out.text[c.sent_text :]
        lps = None
        if out.logprobs is not None and len(out.logprobs) > c.sent_logprobs:
            lps = self.logprobs(out.logprobs[c.sent_logprobs :], c.sent_text)
        if not text and lps is None and not out.finished:
            return None
        c.sent_text = len(out.text)
        c.sent_logprobs = len(out.logprobs or [])
        if lps is None and not out.finished:
            return self._chunk(self._text_item % (c.record.index, dumps(text)), with_usage)
        item = self._delta_item(c.record.index, text, lps, out if out.finished else None)
        return self._chunk(dumps(item), with_usage)

    def delta_chunks(self, c: Choice, with_usage: bool) -> list[str]:
        """The next chunks of a choice: delta_chunk's one, or, where the chat text is parsed
        (reasoning, tool calls), one per delta the parser released, then the finish."""
        if self.chat_output is None:
            chunk = self.delta_chunk(c, with_usage)
            return [] if chunk is None else [chunk]
        out = c.last
        text = out.text[c.sent_text :]
        lps = None
        if out.logprobs is not None and len(out.logprobs) > c.sent_logprobs:
            lps = self.logprobs(out.logprobs[c.sent_logprobs :], c.sent_text)
        c.sent_text, c.sent_logprobs = len(out.text), len(out.logprobs or [])
        if c.chat is None:
            c.chat = self.chat_output.stream()
        deltas = c.chat.feed(text) if text else []
        if out.finished:
            deltas += c.chat.finish()
        if lps is not None and not deltas:
            deltas = [{}]
        index = c.record.index
        items = [
            {"index": index, "delta": d, "logprobs": lps if i == 0 else None, "finish_reason": None}
            for i, d in enumerate(deltas)
        ]
        if out.finished:
            reason = out.finish_reason
            if c.chat.has_calls and reason != "length":
                reason = "tool_calls"
            items.append(
                {
                    "index": index,
                    "delta": {},
                    "logprobs": None,
                    "finish_reason": reason,
                    "stop_reason": out.stop_reason,
                }
            )
        return [self._chunk(dumps(item), with_usage) for item in items]

    def usage_chunk(self, usage_: dict) -> str:
        return self._chunk("", True, dumps(usage_))

    # --- logprobs -----------------------------------------------------------------------
    def _token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def logprobs(self, items: list[Logprob], text_offset: int) -> dict:
        if self.chat:
            return {
                "content": [
                    {
                        **self._lp_entry(lp.token_id, lp.logprob),
                        "top_logprobs": [self._lp_entry(t, v) for t, v in lp.top],
                    }
                    for lp in items
                ]
            }
        tokens, offsets = [], []
        for lp in items:
            offsets.append(text_offset)
            token = self._token(lp.token_id)
            text_offset += len(token)
            tokens.append(token)
        return {
            "tokens": tokens,
            "token_logprobs": [_finite(lp.logprob) for lp in items],
            "top_logprobs": [{self._token(t): _finite(v) for t, v in lp.top} for lp in items],
            "text_offset": offsets,
        }

    def _lp_entry(self, token_id: int, logprob: float) -> dict:
        token = self._token(token_id)
        return {"token": token, "logprob": _finite(logprob), "bytes": list(token.encode("utf-8"))}
