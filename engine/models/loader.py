"""Model loading: resolve what the user named (nothing, a .gguf file, a Hugging Face folder)
to a Hugging Face folder, then build our model and fill it from its safetensors, several
tensors at a time (ParallelCopy)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from engine.models.architectures import model_class
from engine.models.model_config import ModelConfig
from engine.models.weights import QKV_GATE_UP, fused_name
from engine.quant.modules import QuantLinear, quantize_model
from engine.quant.weight_format import WeightQuant

LOAD_WORKERS = 8
"""Threads copying checkpoint tensors into the model at once (at most one per CPU)."""


def resolve_model_folder(model: str | Path | None) -> Path:
    """None -> the embedded default; a .gguf file -> its cached conversion; else a folder."""
    if model is None:
        from engine.models.embedded import default_model_path

        model = default_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise ValueError(
            f"model {str(model)!r} not found: expected a Hugging Face model folder "
            "(config.json, *.safetensors, tokenizer files) or a .gguf file"
        )
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(
                f"model file {path} is not a .gguf file; pass a .gguf file or a "
                "Hugging Face model folder"
            )
        from engine.models.gguf_loader import gguf_to_hf_folder

        return gguf_to_hf_folder(path)
    return path


def needs_conversion(model: str | Path | None) -> bool:
    """Whether resolve_model_folder(model) converts a .gguf file: its first use, seconds to
    minutes; False for a folder, a converted file, or a model it will refuse."""
    try:
        if model is None:
            from engine.models.embedded import default_model_path

            model = default_model_path()
        path = Path(model).expanduser()
        if not path.is_file() or path.suffix.lower() != ".gguf":
            return False
        from engine.models.gguf_loader import is_converted

        return not is_converted(path)
    except OSError:  # resolve_model_folder says what is wrong with it
        return False


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index} names shard(s) that are missing: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"model folder {folder} has no *.safetensors weights "
            "(expected model.safetensors or a sharded index)"
        )
    return files


def iter_safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint, as a view of its memory-mapped shard: nothing is read
    until the tensor is copied (each view keeps its mapping alive after the file is closed)."""
    for file in _safetensors_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_model(
    folder: Path,
    cfg: ModelConfig,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    random_weights: bool = False,
    quant: WeightQuant | None = None,
) -> nn.Module:
    """Build the model on `device` in `dtype` and load its weights (or draw random ones).

    With `quant`, the device never holds the 16-bit model: the checkpoint is loaded on the CPU
    (random weights stay unallocated), then each projection comes to the device in 16 bits (or
    is drawn there), is quantized there and its 16-bit weight freed; the remaining parameters
    (embeddings, norms, LM head) follow. A quantized checkpoint (bitsandbytes, AWQ, GPTQ,
    compressed-tensors, FP8) is converted one projection at a time into our layout
    (engine/quant/formats)."""
    with torch.device("meta"):
        model = model_class(cfg.architecture)(cfg, max_positions).to(dtype=dtype)
    gen = torch.Generator(device=device).manual_seed(0) if random_weights else None
    if quant is None:
        model.to_empty(device=device)
        if random_weights:
            init_random_weights(model, gen)
        else:
            with ParallelCopy() as copy:
                model.load_weights(iter_safetensors(folder), copy)
    elif random_weights:

        def draw(linear: nn.Linear) -> nn.Linear:  # each projection drawn on the device
            return init_random_weights(linear.to_empty(device=device), gen)

        quantize_model(model, quant, device, draw)
        _materialize(model, device)
        init_random_weights(model, gen)
    elif quant.prequantized:
        from engine.quant.formats import convert_checkpoint

        quantize_model(model, quant, device)  # empty: the checkpoint fills them
        _materialize(model, device)
        with ParallelCopy() as copy:
            converted = convert_checkpoint(iter_safetensors(folder), quant)
            model.load_weights(_set_input_orders(model, converted), copy)
    else:
        model.to_empty(device="cpu")
        with ParallelCopy() as copy:
            model.load_weights(iter_safetensors(folder), copy)
        quantize_model(model, quant, device, lambda linear: linear.to(device))
        model.to(device)
    model.init_buffers(device)  # built on meta: the RoPE tables, in fp32
    if cfg.tie_word_embeddings and isinstance(model.embed_tokens, nn.Embedding):
        model.lm_head.weight = model.embed_tokens.weight  # else both read one quantized copy
    return model.eval()


def _set_input_orders(
    model: nn.Module, weights: Iterator[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` less the `<proj>.perm` tensors a GPTQ desc_act checkpoint converts to, each
    handed to its (fused) QuantLinear instead: an input order is not a parameter's rows."""
    fused = getattr(model, "_FUSED", QKV_GATE_UP)
    for name, tensor in weights:
        if not name.endswith(".perm"):
            yield name, tensor
            continue
        target, _ = fused_name(name.removeprefix("model."), fused)
        module = model.get_submodule(target.removesuffix(".perm"))
        module.set_input_order(tensor)


class ParallelCopy:
    """`copy(dst, src)` for Model.load_weights that runs the copies on a pool of threads:
    torch's copy releases the GIL, so the page faults of several memory-mapped tensors and
    their transfers to the device overlap (each thread copies on its own CUDA stream). The
    caller queues at most 2 x workers copies ahead, so tensors a conversion made on the host
    never pile up; a copy that changes the dtype into a device tensor makes a host temporary of
    the converted tensor, so those run one at a time, as a sequential load would. Leaving the
    `with` block waits for every copy and raises the first error."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or min(LOAD_WORKERS, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="load-weights")
        self._queued = threading.BoundedSemaphore(2 * self.workers)
        self._converting = threading.Lock()
        self._local = threading.local()  # each thread's CUDA stream
        self._futures: list[Future] = []
        self._devices: set[torch.device] = set()

    def __call__(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self._queued.acquire()
        future = self._pool.submit(self._copy, dst, src)
        future.add_done_callback(lambda _: self._queued.release())
        self._futures.append(future)

    @torch.no_grad()  # grad mode is per thread: the loader's does not reach the pool's
    def _copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if dst.device.type != "cuda":
            dst.copy_(src)
            return
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(dst.device)
            self._devices.add(dst.device)
        with torch.cuda.stream(stream):
            if dst.dtype == src.dtype:
                dst.copy_(src)
            else:
                with self._converting:
                    dst.copy_(src)

    def __enter__(self) -> ParallelCopy:
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True, cancel_futures=exc[0] is not None)
        for device in self._devices:  # the copies' streams, before any other reads
            torch.cuda.synchronize(device)
        if exc[0] is None:
            for future in self._futures:
                future.result()


def _materialize(model: nn.Module, device: torch.device) -> None:
    """Allocate on `device`, uninitialised, every parameter and buffer still on meta."""
    for module in model.modules():
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
        if any(t.is_meta for t in tensors):
            module.to_empty(device=device, recurse=False)


@torch.no_grad()
def init_random_weights(model: nn.Module, gen: torch.Generator) -> nn.Module:
    """Random weights in real shapes, for speed and memory benchmarks (never zeros); quantized
    layers keep theirs. Returns `model`."""
    quantized = {
        id(p) for m in model.modules() if isinstance(m, QuantLinear) for p in m.parameters()
    }
    for name, param in model.named_parameters():
        if id(param) in quantized:
            continue
        if "norm" in name:
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=gen)
    return model
