"""What crosses between the HTTP front end and the engine core process, as msgpack frames.

Front end -> core, one command per frame:
    [ADD, request_id, prompt (str or token ids), sampling params (dict), arrival_time,
     images (list of images_to_wire entries, or absent)]
    [ABORT, request_id]
    [HELLO]             a front end announces itself (so it gets stats before any request)
    [SHUTDOWN]          abort everything and exit

Core -> front end, one frame per front end per step:
    {"a": [[request_id, error or None, prompt ids or None], ...],   accepted adds
     "o": [delta, ...],                                             new outputs
     "s": stats dict or absent,
     "kv": {request_id: kv blocks} or absent}

A pooling request's vector (RequestOutput.pooled) crosses once, in its finished delta.
Outputs cross as deltas: the token ids, text and logprobs new since the last frame, so a frame
costs what the step produced, not the length of every answer so far. `text_start` says where the
new text goes: the front end keeps text[:text_start] and appends; an engine's text only grows,
except that a stop string can cut it when the request finishes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import msgpack

from engine.multimodal import ImageInput, tensor_bytes
from engine.sampling_params import SamplingParams
from engine.scheduling.request import Logprob, RequestMetrics, RequestOutput, TraceEvent

ADD, ABORT, HELLO, SHUTDOWN = 0, 1, 2, 3
_METRIC_FIELDS = tuple(f.name for f in dataclasses.fields(RequestMetrics))
_PARAM_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams))


def pack(obj) -> bytes:
    return msgpack.packb(obj, default=str)  # a value msgpack cannot carry crosses as its str()


def unpack(frame: bytes):
    return msgpack.unpackb(frame, strict_map_key=False)


def params_to_wire(params: SamplingParams) -> dict:
    data = {name: getattr(params, name) for name in _PARAM_FIELDS}
    if params.structured is not None:
        data["structured"] = params.structured.to_dict()
    return data


def params_from_wire(data: dict) -> SamplingParams:
    return SamplingParams(**data)


def images_to_wire(images: list[ImageInput]) -> list:
    """Each image as [offset, length, hash, {name: [dtype, shape, row-major bytes]}]."""
    return [
        [
            image.offset,
            image.length,
            image.hash,
            {
                name: [str(t.dtype).removeprefix("torch."), list(t.shape), tensor_bytes(t)]
                for name, t in image.data.items()
            },
        ]
        for image in images
    ]


def images_from_wire(data: list) -> list[ImageInput]:
    import torch

    images = []
    for offset, length, digest, tensors in data:
        arrays = {
            name: torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape)
            for name, (dtype, shape, raw) in tensors.items()
        }
        images.append(ImageInput(offset, length, arrays, digest))
    return images


@dataclass
class SentState:
    """What the core has sent of one request: where the next delta starts."""

    tokens: int = 0
    text: int = 0
    logprobs: int = 0


def output_delta(output: RequestOutput, sent: SentState) -> list:
    """The frame entry for `output`, given what was sent before; advances `sent`."""
    tokens = output.token_ids[sent.tokens :]
    start = min(sent.text, len(output.text))
    text = output.text[start:]
    logprobs = None
    if output.logprobs is not None:
        logprobs = [[lp.token_id, lp.logprob, lp.top] for lp in output.logprobs[sent.logprobs :]]
        sent.logprobs = len(output.logprobs)
    sent.tokens, sent.text = len(output.token_ids), len(output.text)
    m = output.metrics
    trace = [[e.time, e.event, e.detail] for e in output.trace] if output.finished else None
    return [
        output.request_id,
        tokens,
        start,
        text,
        output.finished,
        output.finish_reason,
        output.stop_reason,
        [getattr(m, name) for name in _METRIC_FIELDS],
        logprobs,
        trace,
        output.pooled if output.finished else None,
    ]


@dataclass
class Assembled:
    """One request's output as the front end rebuilds it from deltas."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[Logprob] | None = None

    def apply(self, delta: list) -> RequestOutput:
        """Take in one delta; returns the cumulative output as of it (lists copied, so an
        output handed to a consumer never changes under it)."""
        _, tokens, start, text, finished, reason, stop_reason, metrics, logprobs, trace, pooled = (
            delta
        )
        self.token_ids.extend(tokens)
        self.text = self.text[:start] + text if start < len(self.text) else self.text + text
        if logprobs is not None:
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.extend(Logprob(t, lp, [tuple(x) for x in top]) for t, lp, top in logprobs)
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            token_ids=list(self.token_ids),
            text=self.text,
            finished=finished,
            finish_reason=reason,
            metrics=RequestMetrics(**dict(zip(_METRIC_FIELDS, metrics, strict=True))),
            logprobs=list(self.logprobs) if self.logprobs is not None else None,
            stop_reason=stop_reason,
            trace=[TraceEvent(t, e, d) for t, e, d in trace] if trace else [],
            pooled=pooled,
        )
