"""Loading a checkpoint several tensors at a time (engine.models.loader.ParallelCopy): the
same weights as one copy after another, in every load path (16-bit, quantized at load), a
failed copy raised when the load ends, and never more than 2 x workers copies queued, so
tensors made on the host do not pile up."""

from __future__ import annotations

import threading

import pytest
import torch

from engine.models import loader
from engine.models.loader import ParallelCopy, load_model
from engine.models.model_config import ModelConfig
from engine.quant.weight_format import WeightQuant


def _load(folder, monkeypatch, workers: int | None, quant=None, device="cpu", dtype=torch.float32):
    if workers is None:  # the reference: every copy in the loading thread
        monkeypatch.setattr(loader, "ParallelCopy", _Sequential)
    else:
        monkeypatch.setattr(loader, "LOAD_WORKERS", workers)
        monkeypatch.setattr(loader.os, "cpu_count", lambda: workers)
    cfg = ModelConfig.from_folder(folder)
    model = load_model(folder, cfg, 64, dtype, torch.device(device), quant=quant)
    monkeypatch.undo()
    return {name: t.cpu().clone() for name, t in model.state_dict().items()}


class _Sequential:
    def __enter__(self):
        return torch.Tensor.copy_

    def __exit__(self, *exc):
        return None


@pytest.mark.parametrize("quant", [None, "int8"])
def test_parallel_load_gives_the_sequential_weights(tiny_llama, monkeypatch, quant):
    q = WeightQuant(quant) if quant else None
    want = _load(tiny_llama, monkeypatch, None, q)
    got = _load(tiny_llama, monkeypatch, 4, q)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert any(t.abs().sum() > 0 for t in got.values())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parallel_load_to_the_gpu_gives_the_sequential_weights(tiny_llama, monkeypatch, dtype):
    """Each copy on its thread's CUDA stream, the same dtype or a conversion on the way."""
    want = _load(tiny_llama, monkeypatch, None, device="cuda", dtype=dtype)
    got = _load(tiny_llama, monkeypatch, 4, device="cuda", dtype=dtype)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_a_failed_copy_is_raised_when_the_load_ends():
    with pytest.raises(RuntimeError):
        with ParallelCopy(workers=2) as copy:
            copy(torch.zeros(2, 3), torch.ones(4, 5))


def test_at_most_twice_the_workers_are_queued(monkeypatch):
    release = threading.Event()
    started = []
    copy = ParallelCopy(workers=2)

    def slow_copy(dst, src):
        started.append(dst)
        release.wait(10)
        dst.copy_(src)

    monkeypatch.setattr(copy, "_copy", slow_copy)
    dsts = [torch.zeros(3) for _ in range(5)]
    for dst in dsts[:4]:
        copy(dst, torch.ones(3))
    fifth = threading.Thread(target=copy, args=(dsts[4], torch.ones(3)))
    fifth.start()
    fifth.join(0.3)
    assert fifth.is_alive()  # blocked until a queued copy finishes
    release.set()
    fifth.join(10)
    with copy:
        pass
    assert all(torch.equal(d, torch.ones(3)) for d in dsts)
