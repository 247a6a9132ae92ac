"""The planner's inputs and byte formulas: Device, PlanRequest; weights, KV, activations, graphs.

Pure arithmetic over a model shape (engine.models.config.ModelConfig); no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.models.config import ModelConfig

GIB, MIB = 1024**3, 1024**2
WEIGHT_FORMATS = ("none", "int8", "int4")
"""Weight formats, best quality first; "none" = the activation dtype."""
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
INT4_GROUP = 64
"""Weights per 16-bit scale in int4 (NF4-style block quantization)."""
SAFETY_FRACTION, MIN_SAFETY_BYTES = 0.03, 256 * MIB
GRAPH_OVERHEAD_BYTES = 2 * MIB
"""Per captured CUDA graph (kernel parameters, graph bookkeeping); calibrate with --measure."""
GRAPH_POOL_BASE_BYTES = 300 * MIB
"""What the graph pool holds whatever max_num_seqs is (library workspaces captured into it):
`profile --measure` on the H200 (2026-11-29, Llama-3-8B) measured a 0.34 GiB pool with 20
captured sizes up to 256 and 0.32 GiB with 7 up to 32, against 0.06 GiB from the other terms."""
CPU_MAX_MODEL_LEN = 8192
"""The engine caps max_model_len on the CPU (engine.planning.CPU_MAX_MODEL_LEN)."""


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def weight_bytes(m: ModelConfig, fmt: str, dtype_bytes: int, quantize_embeddings: bool) -> int:
    """Weights in a format. int8: 1 B/param plus a 16-bit scale per output channel. int4: 0.5
    B/param plus a 16-bit scale per INT4_GROUP weights. Norms stay in the activation dtype, and
    so do embeddings and LM head unless quantize_embeddings."""
    h, i, v = m.hidden_size, m.intermediate_size, m.vocab_size
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    linear = m.num_layers * (h * (q + 2 * kv) + q * h + 3 * h * i)
    rows = m.num_layers * (q + 2 * kv + h + 2 * i + h)
    embed = v * h * (1 if m.tie_word_embeddings else 2)
    other = m.num_params - linear - embed  # norms

    def packed(n: int, n_rows: int) -> int:
        if fmt == "int8":
            return n + 2 * n_rows
        return -(-n // 2) + 2 * -(-n // INT4_GROUP)

    if fmt == "none":
        return m.num_params * dtype_bytes
    embed_rows = v * (1 if m.tie_word_embeddings else 2)
    emb = packed(embed, embed_rows) if quantize_embeddings else embed * dtype_bytes
    return packed(linear, rows) + emb + other * dtype_bytes


def kv_bytes_per_token(m: ModelConfig, kv_dtype: str) -> int:
    """2 x layers x KV heads x head_dim x bytes (int8 adds a 16-bit scale per token and head):
    the engine's own formula (ModelConfig.kv_cache_bytes_per_token)."""
    return m.kv_cache_bytes_per_token(kv_dtype)


def activation_bytes(m: ModelConfig, num_tokens: int, num_rows: int, dtype_bytes: int) -> int:
    """Peak of one forward over num_tokens tokens sampling num_rows rows:
    tokens x bytes x (2 x hidden + max(2 x q + 2 x kv, 3 x intermediate)) + rows x vocab x 28.
    Per layer: the residual stream and normed input (2 h) live across each sub-layer; attention
    holds q/k/v and its output (2 q + 2 kv), the MLP gate_up and silu-mul output (3 i); layers
    reuse the same memory. Sampling: 28 B per row and vocab entry, float32 logits plus the
    sampler's temporaries with every feature on (penalties, top-k/top-p sort, min-p, logprobs,
    seeded draws); measured on the H200 (2026-11-29, 256 rows): 26.8 B on the Llama-3-8B shape,
    25.4 B on Qwen2.5-7B."""
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    per_token = 2 * m.hidden_size + max(2 * q + 2 * kv, 3 * m.intermediate_size)
    return num_tokens * dtype_bytes * per_token + min(num_rows, num_tokens) * m.vocab_size * 28


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The decode-graph ladder of engine.cuda_graphs (mirrored so planning needs no torch)."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs]
    sizes += list(range(8, max_num_seqs, 8 if max_num_seqs <= 64 else 16))
    return sorted(set(sizes + [max_num_seqs]))


def graph_pool_bytes(m: ModelConfig, max_num_seqs: int, dtype_bytes: int) -> int:
    """Decode graphs share one pool sized by the largest graph's forward (no logits: sampling
    runs eagerly), plus GRAPH_OVERHEAD_BYTES per captured batch size and GRAPH_POOL_BASE_BYTES."""
    largest = activation_bytes(m, max_num_seqs, 0, dtype_bytes)
    per_graph = GRAPH_OVERHEAD_BYTES * len(graph_batch_sizes(max_num_seqs))
    return GRAPH_POOL_BASE_BYTES + largest + per_graph


@dataclass
class Device:
    """What the planner needs to know about the device; built from a probe or by hand."""

    kind: str
    """"cuda" or "cpu"."""
    name: str
    total_bytes: int
    """Device memory (on the CPU: the RAM available to us)."""
    used_bytes: int = 0
    """Memory other processes held when probed."""
    bf16_supported: bool = True
    utilization: float = 0.90
    """Default share of total memory to plan with (the GPU class profile's)."""
    cuda_context_bytes: int = GIB // 2
    max_num_seqs: int = 256
    """Largest max_num_seqs to plan."""
    max_num_batched_tokens: int = 2048
    bandwidth_gbs: float | None = None
    bf16_tflops: float | None = None
    max_kv_bytes: int | None = None
    """Largest KV pool to plan (the CPU's: see the planner); None = as much as fits."""

    def __post_init__(self) -> None:
        if self.kind not in ("cuda", "cpu"):
            raise ValueError(f"device kind must be cuda or cpu, got {self.kind!r}")
        if self.total_bytes <= 0 or self.used_bytes < 0 or self.cuda_context_bytes < 0:
            raise ValueError("device memory figures must be positive")
        if not 0.0 < self.utilization <= 1.0:
            raise ValueError(f"utilization must be in (0, 1], got {self.utilization}")
        if self.max_num_seqs <= 0 or self.max_num_batched_tokens <= 0:
            raise ValueError("device max_num_seqs and max_num_batched_tokens must be positive")


@dataclass
class PlanRequest:
    """Targets and pins. A pinned setting (not None) is kept or refused, never changed."""

    target_num_seqs: int = 8
    """Concurrency the weight format must leave room for..."""
    useful_context: int = 4096
    """...at this many tokens each (capped by the model's maximum)."""
    typical_len: int = 1024
    """A typical request's prompt + output, for max_num_seqs and the concurrency report."""
    block_size: int = 16
    min_seqs_at_max_len: int = 2
    """Unpinned max_model_len is the longest the pool holds this many times."""
    quantize_embeddings: bool = False
    """Quantize embeddings and LM head too (they stay 16-bit by default)."""
    allow_int8_kv: bool = True
    """May the planner choose an int8 KV cache (after every weight format, at 16-bit KV, fails
    to leave room for the target concurrency)."""
    enforce_eager: bool = False
    """No CUDA graphs: no graph pool."""
    measured_activation_bytes: int | None = None
    """Activation peak measured by a profiling forward; None = estimated."""
    gpu_memory_utilization: float | None = None
    dtype: str | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_kv_blocks: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "target_num_seqs",
            "useful_context",
            "typical_len",
            "block_size",
            "min_seqs_at_max_len",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "num_kv_blocks",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        util = self.gpu_memory_utilization
        if util is not None and not 0.0 < util <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util}")
        if self.quantization == "auto":
            self.quantization = None
        if self.quantization not in (None, *WEIGHT_FORMATS):
            raise ValueError(
                f"quantization must be auto, none, int8 or int4, not {self.quantization!r}"
            )
        if self.kv_cache_dtype == "auto":
            self.kv_cache_dtype = None
        for name in ("dtype", "kv_cache_dtype"):
            value = getattr(self, name)
            if value not in (None, "auto", *ELEMENT_BYTES) or (name == "dtype" and value == "int8"):
                raise ValueError(f"unsupported {name} {value!r}")
        if self.dtype == "auto":
            self.dtype = None

    @property
    def pinned(self) -> list[str]:
        return [n for n in PINNABLE if getattr(self, n) is not None]


PINNABLE = (
    "num_kv_blocks",
    "max_num_seqs",
    "max_model_len",
    "max_num_batched_tokens",
    "kv_cache_dtype",
    "quantization",
    "dtype",
    "gpu_memory_utilization",
)


@dataclass
class Plan:
    """The chosen engine settings and the arithmetic behind them (bytes)."""

    device: str
    dtype: str
    quantization: str
    kv_cache_dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_kv_blocks: int
    gpu_memory_utilization: float
    total_bytes: int
    budget_bytes: int
    weight_bytes: int
    activation_bytes: int
    activation_measured: bool
    graph_pool_bytes: int
    cuda_context_bytes: int
    margin_bytes: int
    kv_pool_bytes: int
    kv_bytes_per_token: int
    typical_len: int
    concurrency_at_max_len: int
    concurrency_at_typical_len: int
    target_met: bool
    reasons: dict[str, str] = field(default_factory=dict)
    """Setting name -> one line saying why it has its value."""

    def engine_kwargs(self) -> dict:
        """The settings as EngineConfig keyword arguments."""
        names = (
            "dtype",
            "quantization",
            "kv_cache_dtype",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
            "num_kv_blocks",
            "gpu_memory_utilization",
        )
        return {n: getattr(self, n) for n in names}

    def to_dict(self) -> dict:
        return asdict(self)


class PlanError(ValueError):
    """Pinned settings that cannot fit; the message names one setting and its new value."""

    def __init__(self, message: str, setting: str, value: object) -> None:
        super().__init__(message)
        self.setting, self.value = setting, value
