"""Engine configuration: one typed dataclass, validated where it is built."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar


@dataclass
class EngineConfig:
    """Knobs of the engine. CLI flags use the same names with dashes."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "dtype": ("auto", "float32", "float16", "bfloat16"),
        "kv_cache_dtype": ("auto", "float32", "float16", "bfloat16", "int8"),
        "quantization": ("none", "int8", "int4", "auto"),
        "load_format": ("auto", "random"),
    }
    """The allowed values of each str setting (checked here; `appliance serve` and `profile`
    offer them as the flags' choices)."""

    max_model_len: int | None = None
    """Longest prompt + output in tokens; None = the model's maximum (capped at 8192 on CPU)."""
    max_num_seqs: int = 64
    """Most sequences running (holding KV blocks) at once."""
    max_num_batched_tokens: int = 2048
    """Token budget of one engine step (decode tokens + prefill chunk tokens)."""
    block_size: int = 16
    """Tokens per KV-cache block."""
    num_kv_blocks: int | None = None
    """KV-cache blocks in the pool; None = planned from memory."""
    gpu_memory_utilization: float = 0.90
    """Share of total device memory the engine may use (weights + activations + KV)."""
    dtype: str = "auto"
    """Weights/activations dtype: auto (fp32 on CPU, bf16 on GPUs that support it), float32,
    float16 or bfloat16."""
    kv_cache_dtype: str = "auto"
    """KV-cache element type; auto = the activation dtype."""
    quantization: str = "none"
    """Weight quantization: none, int8 (per-row), int4 (NF4 per group) or auto (16-bit here; the
    appliance planner picks). A bitsandbytes-quantized checkpoint keeps its own (none/auto)."""
    quant_block_size: int = 64
    """int4: weights per absmax group along a row (even; divides the layers' input sizes)."""
    quantize_embeddings: bool = False
    """With int8/int4: quantize the LM head and input embeddings too (16-bit by default)."""
    enforce_eager: bool = False
    """Disable CUDA graphs (plain eager path)."""
    overlap_steps: bool = True
    """On a GPU, launch the next step before reading this step's tokens back, so the GPU
    never waits for the host's scheduling and reporting (tokens are reported one step later)."""
    seed: int = 0
    """Seed for requests that do not bring their own."""
    cpu_kv_cache_gib: float = 2.0
    """KV-cache budget on the CPU when num_kv_blocks is None."""
    adaptive_batching: bool = False
    """Scale the step's token budget with the waiting queue: min_num_batched_tokens when nobody
    waits (short prefill chunks keep decodes fast), max_num_batched_tokens once the queue holds
    max_num_seqs requests (admit at full speed)."""
    min_num_batched_tokens: int = 512
    """The step's token budget with an empty queue when adaptive_batching is on."""
    load_format: str = "auto"
    """auto = the checkpoint's weights; random = random weights in the config's shapes
    (benchmarks: only config.json is needed, prompts are token ids)."""

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
        if self.quant_block_size % 2:
            raise ValueError(f"quant_block_size must be even, got {self.quant_block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        for name, allowed in self.CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.cpu_kv_cache_gib <= 0:
            raise ValueError(f"cpu_kv_cache_gib must be > 0, got {self.cpu_kv_cache_gib}")

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
