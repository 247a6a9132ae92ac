"""EngineInfo: what the front end knows of the engine in the core process, sent once when the
core is ready: names, configuration, plan, and the tokenizer (tokenization, chat templates and
the /tokenize routes run in the front end, off the core's busy loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.multimodal.processing import model_takes_images
from engine.text.tokenizer import (  # transformers: imported lazily
    apply_chat_template,
    encode_prompt,
)


@dataclass
class EngineInfo:
    model_name: str
    config: EngineConfig
    device: str
    tokenizer: Any
    """The engine's tokenizer (pickled across), or None for a token-ids-only model."""
    model_type: str | None = None
    """config.json's model_type ("llama", "qwen3", ...), for choosing a tool-call parser."""
    vocab_size: int | None = None
    """Token ids run from 0 to vocab_size - 1."""
    plan: dict | None = None
    """LLMEngine.plan_report(): the plan, the memory check, the start-up times."""
    stats: dict | None = None
    """engine.stats() when the core started serving."""
    eos_token_ids: frozenset[int] = frozenset()
    """Every token id that ends generation (structured outputs allow them at a grammar's end)."""
    logits_size: int | None = None
    """The model's logits width (config vocab_size; it may pad past the tokenizer's)."""
    kind: str = "generate"
    """What the model serves, one of engine.models.model_kind.KINDS: "generate" (text),
    "embed" (/v1/embeddings) or "rerank" (/v1/rerank)."""
    is_encoder: bool = False
    """A BERT-like encoder: a reranker's inputs are the tokenizer's (query, document) pairs."""
    embedding_size: int | None = None
    """The length of an embedding model's vectors (its hidden size); None for other kinds."""
    folder: str | None = None
    """The model's folder (None for a .gguf-only or generated model): the front end loads the
    image processor from it."""
    takes_images: bool = False
    """The model reads images (config.json has a vision_config and an image token id)."""

    @classmethod
    def of(cls, engine: Any) -> EngineInfo:
        report = getattr(engine, "plan_report", None)
        kind = engine.kind.kind if hasattr(engine, "kind") else "generate"
        model_config = getattr(engine, "model_config", None)
        folder = getattr(engine, "folder", None)
        if engine.tokenizer is not None:
            vocab_size = len(engine.tokenizer)
        else:
            vocab_size = getattr(model_config, "vocab_size", None)
        return cls(
            model_name=engine.model_name,
            config=engine.config,
            device=str(engine.device),
            tokenizer=engine.tokenizer,
            vocab_size=vocab_size,
            model_type=getattr(model_config, "model_type", None),
            plan=report() if report is not None else None,
            stats={**engine.stats(), "num_unfinished": 0, "last_step_s": 0.0},
            eos_token_ids=frozenset(getattr(engine, "eos_token_ids", ())),
            logits_size=getattr(model_config, "vocab_size", None),
            kind=kind,
            is_encoder=bool(getattr(engine, "is_encoder", False)),
            embedding_size=getattr(model_config, "hidden_size", None) if kind == "embed" else None,
            folder=None if folder is None else str(folder),
            takes_images=model_takes_images(folder),
        )

    def plan_report(self) -> dict | None:
        return self.plan

    def encode(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, add_special_tokens)

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: it cannot turn token ids into text")
        return self.tokenizer.decode(token_ids)

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> list[int]:
        return apply_chat_template(self.tokenizer, messages, tools, template_kwargs)
