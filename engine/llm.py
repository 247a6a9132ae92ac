"""LLM: the offline API. `LLM(model).generate(prompts, params)` runs requests to completion."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from engine.llm_engine import LLMEngine
from engine.multimodal import ImageInput
from engine.sampling_params import SamplingParams
from engine.scheduling.request import RequestOutput
from engine.text.rerank_prompt import rerank_token_ids


class LLM:
    """Offline generation over the continuous-batching engine.

    `model`: a Hugging Face model folder or a .gguf file; None = the embedded default
    (SmolLM2-135M-Instruct). `config`: EngineConfig settings (max_model_len, max_num_seqs, ...;
    enable_prefix_caching=False is prefix_caching=False).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        device: str = "auto",
        dtype: str = "auto",
        **config,
    ) -> None:
        if "enable_prefix_caching" in config:  # vLLM's name for it
            config["prefix_caching"] = config.pop("enable_prefix_caching")
        self.engine = LLMEngine(model, device=device, dtype=dtype, **config)
        self._ids = itertools.count()

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | Sequence[str] | Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        images: Sequence[list[ImageInput] | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt (text or token ids) to completion; outputs in prompt order.
        `images`: each prompt's images (engine.multimodal), their placeholders in its ids."""
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        if params is None:
            params = SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} SamplingParams")
        if self.engine.kind.kind != "generate" and any(p.pooling is None for p in params):
            raise ValueError(
                f"{self.engine.model_name} is a {self.engine.kind.kind} model: it does not "
                "generate text (use LLM.embed or LLM.score)"
            )
        encoded = [self.engine.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        images = list(images) if images is not None else [None] * len(prompts)
        if len(images) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(images)} image lists")
        for token_ids, p, pictures in zip(encoded, params, images):
            # all or nothing: raise before queueing any
            self.engine.validate(token_ids, p, pictures)
            self.engine.check_structured(p)
        ids = [f"offline-{next(self._ids)}" for _ in prompts]
        for request_id, token_ids, p, pictures in zip(ids, encoded, params, images):
            self.engine.add_request(request_id, token_ids, p, images=pictures)
        return self._run(ids)

    def embed(self, prompts: str | Sequence[str] | Sequence[Sequence[int]]) -> list[list[float]]:
        """The L2-normalised embedding of each prompt (text or token ids), in prompt order."""
        if self.engine.kind.kind != "embed":
            raise ValueError(f"{self.engine.model_name} is not an embedding model")
        outputs = self.generate(prompts, SamplingParams(max_tokens=1, pooling="embed"))
        return [out.pooled for out in outputs]

    def score(
        self, query: str, documents: Sequence[str], instruction: str | None = None
    ) -> list[float]:
        """A reranker's relevance of each document to the query, in [0, 1], in document
        order (engine/text/rerank_prompt.py)."""
        engine = self.engine
        prompts = [
            rerank_token_ids(engine.tokenizer, query, d, instruction, engine.is_encoder)
            for d in documents
        ]
        outputs = self.generate(prompts, SamplingParams(max_tokens=1, pooling="score"))
        return [out.pooled[0] for out in outputs]

    def chat(
        self, conversations: Sequence[list[dict]], params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        """Apply the chat template to each conversation, then generate."""
        return self.generate([self.engine.apply_chat_template(c) for c in conversations], params)

    def _run(self, ids: list[str]) -> list[RequestOutput]:
        final: dict[str, RequestOutput] = {}
        wanted = set(ids)
        while len(final) < len(ids):
            for out in self.engine.step():
                if out.finished and out.request_id in wanted:
                    final[out.request_id] = out
        return [final[i] for i in ids]
