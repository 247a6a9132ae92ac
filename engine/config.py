"""Engine configuration: one typed dataclass, validated where it is built."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

SPECULATIVE_MODES = ("off", "ngram")
"""speculative's values besides draft:PATH."""
DRAFT_PREFIX = "draft:"


@dataclass
class EngineConfig:
    """Knobs of the engine. CLI flags use the same names with dashes."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "dtype": ("auto", "float32", "float16", "bfloat16"),
        "kv_cache_dtype": ("auto", "float32", "float16", "bfloat16", "int8"),
        "quantization": ("none", "int8", "int4", "fp8", "auto"),
        "load_format": ("auto", "random"),
        "task": ("auto", "generate", "embed", "rerank"),
    }
    """The allowed values of each str setting (checked here; `appliance serve` and `profile`
    offer them as the flags' choices)."""

    max_model_len: int | None = None
    """Longest prompt + output in tokens; unset (None) = planned (the model's maximum where
    memory holds two such sequences, at most 8192 on a CPU)."""
    max_num_seqs: int | None = None
    """Most sequences running (holding KV blocks) at once; unset (None) = planned (as many
    typical requests as the KV pool holds, up to the GPU class's cap)."""
    max_num_batched_tokens: int | None = None
    """Token budget of one engine step (decode tokens + prefill chunk tokens); unset (None) =
    the GPU class's prefill chunk."""
    block_size: int = 16
    """Tokens per KV-cache block."""
    num_kv_blocks: int | None = None
    """KV-cache blocks in the pool; unset (None) = planned from memory."""
    gpu_memory_utilization: float | None = None
    """Share of total device memory the engine may use (weights + activations + KV); unset
    (None) = the GPU class's default."""
    dtype: str = "auto"
    """Weights/activations dtype: auto (fp32 on CPU, bf16 on GPUs that support it), float32,
    float16 or bfloat16."""
    kv_cache_dtype: str = "auto"
    """KV-cache element type: auto (planned: the activation dtype, or int8 where a 16-bit cache
    leaves no room for the planner's target), float32, float16, bfloat16 or int8."""
    quantization: str = "auto"
    """Weight quantization: auto (planned: 16-bit where it leaves room for the planner's target,
    else int8, else int4), none, int8 (per-row) or int4 (NF4 per group). A quantized checkpoint
    (bitsandbytes, AWQ, GPTQ, compressed-tensors, FP8) keeps its own format: auto, or that format
    (int8, int4, fp8); fp8 names an FP8 checkpoint's weights only."""
    quant_block_size: int = 64
    """int4: weights per absmax group along a row (even; divides the layers' input sizes)."""
    quantize_embeddings: bool = False
    """With int8/int4: quantize the LM head and input embeddings too (16-bit by default)."""
    enforce_eager: bool = False
    """Disable CUDA graphs (plain eager path)."""
    prefix_caching: bool = True
    """Keep the KV of full blocks for later requests with the same prefix (shared system
    prompts, the earlier turns of a chat): their prefill starts after it."""
    overlap_steps: bool = True
    """On a GPU, launch the next step before reading this step's tokens back, so the GPU
    never waits for the host's scheduling and reporting (tokens are reported one step later).
    A speculative step that drafts runs without it (its drafts need the tokens on the host)."""
    seed: int = 0
    """Seed for requests that do not bring their own."""
    adaptive_batching: bool = False
    """Scale the step's token budget with the waiting queue: min_num_batched_tokens when nobody
    waits (short prefill chunks keep decodes fast), max_num_batched_tokens once the queue holds
    max_num_seqs requests (admit at full speed)."""
    min_num_batched_tokens: int = 512
    """The step's token budget with an empty queue when adaptive_batching is on."""
    long_prompt_share: float = 0.5
    """While a short request waits, the share of a step's token budget that long prompts'
    chunks may take together (0 < share <= 1; engine.scheduling.scheduling_policy). Alone, a long
    prompt takes it all."""
    long_prompt_tokens: int | None = None
    """A prompt is long when more than this many of its tokens remain to compute; unset (None) =
    more than long_prompt_share of the step's token budget."""
    queue_aging_s: float = 30.0
    """A request waiting this long (seconds since arrival) ranks ahead of every request that is
    not, in arrival order, whatever its class, client or length: the bound on starvation."""
    fair_share_window_s: float = 60.0
    """Time constant of the decay of each client's served tokens (the fair-share order)."""
    speculative: str = "off"
    """Speculative decoding: off; ngram (prompt lookup: each decode drafts the tokens that
    followed the latest earlier occurrence of its last few tokens); or draft:PATH (a small
    model sharing the target's tokenizer, in the folder PATH, drafts its greedy continuation;
    its KV lives in the same blocks). One forward verifies the drafts (engine/spec/). Outputs
    are the same either way; a model with linear-attention layers and requests with a
    grammar do not speculate."""
    num_speculative_tokens: int | None = None
    """Drafted tokens per decode and step (k) with speculative decoding, fixed; unset (None):
    chosen each step (0-8) from step costs measured at start-up (engine/spec/draft_length.py)."""
    load_format: str = "auto"
    """auto = the checkpoint's weights; random = random weights in the config's shapes
    (benchmarks: only config.json is needed, prompts are token ids)."""
    task: str = "auto"
    """What the model serves: auto (read from its folder: config.json's architecture, the
    sentence-transformers files, "reranker" in a causal LM's name), generate, embed (pooled
    vectors) or rerank (a cross-encoder's score, or a causal LM's yes/no logit as
    Qwen3-Reranker's)."""
    max_encoder_tokens: int = 512
    """Image placeholders one step may send to the vision encoder (a step's first image always
    goes): bounds the time an image's encoding adds to the decodes sharing its step. 512 is two
    Gemma 3 images (8192 SigLIP patches, about 30 ms on an H100 for the 12B's encoder); at
    2048, 32 images at once held decode steps up to 1.1 s (results/2026-12-06-h100-vision)."""

    def __post_init__(self) -> None:
        def positive(name: str, value: int | None) -> None:
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

        positive("max_model_len", self.max_model_len)
        positive("max_num_seqs", self.max_num_seqs)
        positive("max_num_batched_tokens", self.max_num_batched_tokens)
        positive("block_size", self.block_size)
        positive("num_kv_blocks", self.num_kv_blocks)
        positive("min_num_batched_tokens", self.min_num_batched_tokens)
        positive("quant_block_size", self.quant_block_size)
        positive("long_prompt_tokens", self.long_prompt_tokens)
        positive("num_speculative_tokens", self.num_speculative_tokens)
        positive("max_encoder_tokens", self.max_encoder_tokens)
        if not 0.0 < self.long_prompt_share <= 1.0:
            raise ValueError(f"long_prompt_share must be in (0, 1], got {self.long_prompt_share}")
        for name in ("queue_aging_s", "fair_share_window_s"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"{name} must be a positive number of seconds, got {getattr(self, name)!r}"
                )
        if self.quant_block_size % 2:
            raise ValueError(f"quant_block_size must be even, got {self.quant_block_size}")
        util = self.gpu_memory_utilization
        if util is not None and not 0.0 < util <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        spec = self.speculative
        if spec not in SPECULATIVE_MODES and not (
            isinstance(spec, str) and spec.startswith(DRAFT_PREFIX) and spec[len(DRAFT_PREFIX) :]
        ):
            raise ValueError(
                f"speculative must be off, ngram or draft:PATH (a draft model's folder), "
                f"got {spec!r}"
            )
        for name, allowed in self.CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

    @property
    def draft_model(self) -> str | None:
        """The draft model's folder of speculative="draft:PATH"; None otherwise."""
        spec = self.speculative
        return spec[len(DRAFT_PREFIX) :] if spec.startswith(DRAFT_PREFIX) else None

    def budget_prompt_lengths(self, max_tokens: int) -> list[int]:
        """Prompt lengths that, arriving together, fill one step's token budget: one prompt
        where max_model_len allows it, several where it is shorter (each leaves room for
        max_tokens more, and there are at most max_num_seqs). Warm-up and the memory check's
        peak step start with them, so the activation peak they see is the serving one."""
        longest = min(self.max_num_batched_tokens, self.max_model_len - max_tokens - 1)
        if longest < 1:
            return []
        count = min(self.max_num_seqs, -(-self.max_num_batched_tokens // longest))
        return [longest] * count

    @classmethod
    def from_kwargs(cls, **kwargs) -> EngineConfig:
        """Build from keyword arguments, naming any that are not engine settings."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(f"unknown engine setting(s) {unknown}; known: {sorted(names)}")
        return cls(**kwargs)
