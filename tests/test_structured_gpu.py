"""Structured outputs on the GPU: the bitmask applied on the device, with CUDA graphs and the
overlapped step loop (the mask is filled while the forward runs), equals the plain loop."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine import LLM, SamplingParams
from engine.structured import StructuredOutput

pytestmark = pytest.mark.gpu

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def _params(i: int) -> SamplingParams:
    structured = StructuredOutput.json_schema(SCHEMA) if i % 2 == 0 else None
    return SamplingParams(
        max_tokens=80, temperature=0.0 if i % 4 < 2 else 0.9, seed=i, structured=structured
    )


def _run(overlap: bool) -> list:
    llm = LLM(device="cuda", max_model_len=1024, max_num_seqs=16)
    assert llm.engine.runner.graphs is not None
    llm.engine._overlap = overlap
    prompt = llm.engine.apply_chat_template([{"role": "user", "content": "A person as JSON."}])
    outs = llm.generate([prompt] * 16, [_params(i) for i in range(16)])
    return [(o.token_ids, o.finish_reason, o.text) for o in outs]


def test_gpu_structured_overlap_equals_plain_and_validates():
    overlapped, plain = _run(True), _run(False)
    assert [o[:2] for o in overlapped] == [p[:2] for p in plain]
    for i, (_, reason, text) in enumerate(overlapped):
        if i % 2 == 0:
            assert reason == "stop", text
            jsonschema.validate(json.loads(text), SCHEMA)
