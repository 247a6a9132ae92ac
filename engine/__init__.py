"""Inference engine: paged KV cache, continuous batching, our own Llama-family model.

Offline use: `from engine import LLM, SamplingParams`.
"""

from engine.config import EngineConfig
from engine.llm import LLM
from engine.request import RequestOutput
from engine.sampling_params import SamplingParams

__all__ = ["LLM", "EngineConfig", "RequestOutput", "SamplingParams"]
