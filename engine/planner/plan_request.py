"""The planner's input and output types: PlanRequest (targets and pins), Plan (the settings and
the arithmetic behind them), PlanError (pins that cannot fit). PINNABLE is the one list of the
engine settings the planner chooses."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.config import EngineConfig
from engine.planner.formulas import (
    CHECKPOINT_FORMATS,
    ELEMENT_BYTES,
    WEIGHT_FORMATS,
    WeightLayout,
    decode_weight_bytes,
)

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
"""Engine settings (engine.config.EngineConfig fields) the planner chooses unless pinned, in
the order a refusal tries them."""
PLANNED = (*PINNABLE, "block_size")
"""Every engine setting a Plan carries."""
IMAGE_LIMITS = ("max_image_pixels", "max_images_per_request")
"""The server's image limits (appliance.settings.ServeSettings fields) that PlanRequest takes
too: they size the vision encoder's share of the plan."""
AUTO = "auto"
"""A str setting left to the planner (None for numbers)."""
CPU_NAMES = {"gpu_memory_utilization": "memory_utilization"}
"""How a CPU plan names the settings whose engine names speak of a GPU (the share of the RAM
the plan takes is still set with --gpu-memory-utilization)."""


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
    quant_block_size: int = 64
    """int4: weights per scale (the engine's quant_block_size)."""
    allow_int8_kv: bool = True
    """May the planner choose an int8 KV cache (after every weight format, at 16-bit KV, fails
    to leave room for the target concurrency)."""
    enforce_eager: bool = False
    """No CUDA graphs: no graph pool."""
    gpu_memory_utilization: float | None = None
    dtype: str | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_kv_blocks: int | None = None
    checkpoint_layout: WeightLayout | None = None
    """A quantized checkpoint's own layout (bits, scale groups, zero points): its weights are
    counted as stored, and `quantization` (its format) is pinned; None: not quantized."""
    draft_model: object | None = None
    """The ModelConfig of a draft model for speculative decoding (engine/spec/draft_model.py),
    or None: its weights (16-bit) are counted with the target's, and its K/V in every block."""
    max_encoder_tokens: int = EngineConfig.max_encoder_tokens
    """Image placeholders one step sends to the vision encoder (the engine's setting): sizes
    the encoder's activation peak (engine/planner/vision_bytes.py)."""
    max_image_pixels: int = 4096 * 4096
    """The largest image the server accepts (`serve --max-image-pixels`; its default)."""
    max_images_per_request: int = 8
    """Most images one request may send (`serve --max-images-per-request`; its default)."""

    def __post_init__(self) -> None:
        for name in (
            "target_num_seqs",
            "useful_context",
            "typical_len",
            "block_size",
            "min_seqs_at_max_len",
            "quant_block_size",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "num_kv_blocks",
            "max_encoder_tokens",
            "max_image_pixels",
            "max_images_per_request",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        util = self.gpu_memory_utilization
        if util is not None and not 0.0 < util <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util}")
        for name in ("dtype", "quantization", "kv_cache_dtype"):
            if getattr(self, name) == AUTO:
                setattr(self, name, None)
        if self.quantization in CHECKPOINT_FORMATS and self.checkpoint_layout is None:
            raise ValueError(
                f"quantization {self.quantization!r} is read from a checkpoint that holds it"
            )
        if self.quantization not in (None, *WEIGHT_FORMATS, *CHECKPOINT_FORMATS):
            raise ValueError(
                f"quantization must be auto, none, int8 or int4, not {self.quantization!r}"
            )
        for name in ("dtype", "kv_cache_dtype"):
            value = getattr(self, name)
            if value not in (None, *ELEMENT_BYTES) or (name == "dtype" and value == "int8"):
                raise ValueError(f"unsupported {name} {value!r}")

    @classmethod
    def from_config(cls, config, **targets) -> PlanRequest:
        """The pins of an engine.config.EngineConfig (None or "auto" = planned), with its
        block size, quantization details and graph setting; `targets` override the defaults
        (target_num_seqs, useful_context, ...)."""
        pins = {name: getattr(config, name) for name in PINNABLE}
        return cls(
            block_size=config.block_size,
            quantize_embeddings=config.quantize_embeddings,
            quant_block_size=config.quant_block_size,
            enforce_eager=config.enforce_eager,
            max_encoder_tokens=config.max_encoder_tokens,
            **pins,
            **targets,
        )

    @property
    def pinned(self) -> list[str]:
        return [n for n in PINNABLE if getattr(self, n) is not None]


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
    graph_pool_bytes: int
    allocator_bytes: int
    """Cached allocator blocks beyond live tensors at the peak (engine.memory.memory_check)."""
    cuda_context_bytes: int
    margin_bytes: int
    kv_pool_bytes: int
    kv_bytes_per_token: int
    typical_len: int
    concurrency_at_max_len: int
    concurrency_at_typical_len: int
    target_met: bool
    reasons: dict[str, str] = field(default_factory=dict)
    weight_format: str = ""
    """How the weights are stored, in words, with the bytes a weight and its scales take
    ("int4 (awq, groups of 128, zero points), 0.5 B a weight + 8 B a group of 128 ...")."""
    """Setting name -> one line saying why it has its value."""
    bandwidth_gbs: float | None = None
    """The device's peak memory bandwidth, GB/s (the decode floor's divisor); None = unknown."""
    bandwidth_source: str | None = None
    """Where bandwidth_gbs comes from (engine.planner.device: nominal from a class profile)."""
    num_params: int | None = None
    """The model's parameters, every expert included; None = not known."""
    num_active_params: int | None = None
    """The parameters one token's forward reads (with experts: num_experts_per_tok of them)."""
    state_bytes_per_sequence: int = 0
    """One sequence's linear-attention state (formulas.state_bytes_per_sequence); 0 for a
    model without linear layers."""
    state_pool_bytes: int = 0
    """The state pool: max_num_seqs slots of state_bytes_per_sequence, reserved before the KV
    pool."""
    expert_bytes: int = 0
    """Every expert's weight bytes, all MoE layers (part of weight_bytes); 0 for a dense model."""
    num_experts: int = 0
    num_experts_per_tok: int = 0
    draft_weight_bytes: int = 0
    """A draft model's weights (speculative decoding; not part of weight_bytes); 0 without."""
    draft_kv_bytes_per_token: int = 0
    """A draft model's K/V bytes per token, held in the same blocks as the target's (a block
    is block_size x (kv_bytes_per_token + this)); 0 without a draft model."""
    vision_weight_bytes: int = 0
    """A multimodal model's vision encoder weights (not part of weight_bytes: a decode step
    does not read them); 0 for a text model."""
    vision_activation_bytes: int = 0
    """The vision encoder's peak in one step plus one request's cached image rows
    (engine/planner/vision_bytes.py); 0 for a text model."""

    def decode_weight_bytes(self, num_seqs: int) -> int:
        """The weight bytes a decode step of num_seqs sequences reads: all of weight_bytes but
        the experts the batch cannot route to (formulas.decode_weight_bytes)."""
        return decode_weight_bytes(
            self.weight_bytes,
            self.expert_bytes,
            self.num_experts,
            self.num_experts_per_tok,
            num_seqs,
        )

    def decode_bytes(self, context_lens: list[int]) -> int:
        """What one decode step reads: the weights it can route to, each sequence's context
        (the new token included) x KV bytes per token, and each sequence's state, read and
        written back (2 x state_bytes_per_sequence)."""
        kv = sum(context_lens) * self.kv_bytes_per_token
        state = 2 * len(context_lens) * self.state_bytes_per_sequence
        return self.decode_weight_bytes(len(context_lens)) + kv + state

    def engine_kwargs(self) -> dict:
        """The planned settings as EngineConfig keyword arguments."""
        return {n: getattr(self, n) for n in PLANNED}

    @property
    def others_bytes(self) -> int:
        """Memory other processes held when planning (counted against the budget)."""
        return int(self.total_bytes * self.gpu_memory_utilization) - self.budget_bytes

    def to_dict(self) -> dict:
        return asdict(self)


def plan_settings(plan: dict) -> list[tuple[str, object, str]]:
    """(name, value, reason) for each setting of a plan (Plan.to_dict(), or the plan an engine
    reports), in the words of the plan's device: a CPU plan speaks of no GPU."""
    names = CPU_NAMES if plan.get("device") == "cpu" else {}
    reasons = plan.get("reasons") or {}
    return [(names.get(n, n), plan.get(n), reasons.get(n, "")) for n in PLANNED if n in plan]


class PlanError(ValueError):
    """Pinned settings that cannot fit; the message names one setting and its new value."""

    def __init__(self, message: str, setting: str, value: object) -> None:
        super().__init__(message)
        self.setting, self.value = setting, value
