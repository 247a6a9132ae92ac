"""A reranker's input for (query, document): a cross-encoder's (BERT) is the tokenizer's pair
encoding ([CLS] query [SEP] document [SEP]); a Qwen3-Reranker's is its judging template, scored
by the "yes" against "no" logit at the end (engine/runner/pooler.py; the template is the model
card's)."""

from __future__ import annotations

from engine.text.tokenizer import encode_prompt

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
"""The instruction when the caller gives none (the model card's)."""

_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def rerank_prompt(query: str, document: str, instruction: str | None = None) -> str:
    """The text a Qwen3-Reranker scores for (query, document)."""
    return _PREFIX + _body(query, document, instruction) + _SUFFIX


def _body(query: str, document: str, instruction: str | None) -> str:
    instruction = instruction or DEFAULT_INSTRUCTION
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


def score_token_ids(tokenizer) -> tuple[int, int]:
    """(no, yes): the reranker's answer tokens; ValueError when either is not one token."""
    ids = []
    for word in ("no", "yes"):
        encoded = [] if tokenizer is None else tokenizer.encode(word, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(
                f"this reranker's tokenizer has no single token for {word!r}: it cannot score"
            )
        ids.append(encoded[0])
    return ids[0], ids[1]


def rerank_token_ids(
    tokenizer, query: str, document: str, instruction: str | None, cross_encoder: bool
) -> list[int]:
    """The token ids a reranker scores for (query, document)."""
    if cross_encoder:
        encode_prompt(tokenizer, query + document)  # the same refusals as any prompt
        return list(tokenizer(query, document)["input_ids"])
    # Encoded in three parts, as the model card does: the template's ends tokenize alone.
    body = _body(query, document, instruction)
    return [
        t
        for part in (_PREFIX, body, _SUFFIX)
        for t in encode_prompt(tokenizer, part, add_special_tokens=False)
    ]
