"""Quantizing at load time never holds the 16-bit model on the device: whenever a projection is
quantized, at most one layer's projections sit on the device in 16 bits. Without a GPU the
checkpoint case loads onto the meta device as the stand-in target (so the CPU staging and the
device differ); random weights load onto the CPU, where undrawn projections stay on meta. On a
GPU (-m gpu): Llama-3-8B with random weights loads in int4 under 7.5 GiB, in int8 under 10 GiB."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.models import loader
from engine.models.llama import LlamaForCausalLM
from engine.models.model_config import ModelConfig
from engine.quant import modules
from engine.quant.modules import QUANTIZED_LINEARS, QuantLinear
from engine.quant.weight_format import WeightQuant

pytestmark = pytest.mark.skipif(  # not imported here: it imports triton (see test_quant_linear)
    importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed"
)
PRESETS = Path(__file__).resolve().parent.parent / "profiles" / "models"
GIB = 2**30


def _projections(model: nn.Module) -> list[nn.Module]:
    return [m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in QUANTIZED_LINEARS]


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize(
    "random_weights, device", [(False, "meta"), (True, "cpu")], ids=["checkpoint", "random"]
)
def test_at_most_one_layer_is_on_the_device_in_16_bits(
    kind, random_weights, device, tiny_llama, monkeypatch
):
    models = []

    class Recorded(LlamaForCausalLM):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            models.append(self)

    on_device = []  # bytes of 16-bit projection weights on the device, at each quantization

    def quantize(w: torch.Tensor, *args):  # shapes only: meta tensors cannot be quantized
        (model,) = models
        on_device.append(
            sum(
                m.weight.nbytes
                for m in _projections(model)
                if isinstance(m, nn.Linear) and m.weight.device == w.device
            )
        )
        n, k = w.shape
        if kind == "int8":
            return w.new_zeros(n, k, dtype=torch.int8), w.new_ones(n, dtype=torch.float32)
        return w.new_zeros(n, k // 2, dtype=torch.uint8), w.new_ones(
            n, k // 64, dtype=torch.float32
        )

    monkeypatch.setattr(loader, "model_class", lambda name: Recorded)
    monkeypatch.setattr(modules, "quantize_int8", quantize)
    monkeypatch.setattr(modules, "quantize_4bit", quantize)
    cfg = ModelConfig.from_folder(tiny_llama)
    model = loader.load_model(
        tiny_llama,
        cfg,
        128,
        torch.bfloat16,
        torch.device(device),
        random_weights,
        WeightQuant(kind),
    )

    one_layer = sum(m.weight.nbytes for m in _projections(LlamaForCausalLM(cfg, 128).layers[0]))
    one_layer //= 2  # built in fp32, loaded in bf16
    assert len(on_device) == 4 * cfg.num_layers  # every projection was quantized...
    assert 0 < min(on_device) and max(on_device) <= one_layer  # ...on the device, a few at a time
    assert all(isinstance(m, QuantLinear) for m in _projections(model))
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {device}


@pytest.mark.gpu
@pytest.mark.parametrize("kind, max_gib", [("int4", 7.5), ("int8", 10.0)])
def test_llama_3_8b_quantizes_at_load_within_a_small_card(kind, max_gib, tmp_path):
    config = json.loads((PRESETS / "llama-3-8b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = ModelConfig.from_folder(tmp_path)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    model = loader.load_model(
        tmp_path, cfg, 1024, torch.bfloat16, torch.device("cuda"), True, WeightQuant(kind)
    )
    peak = torch.cuda.max_memory_allocated() - before
    weights = sum(t.nbytes for t in model.state_dict().values())
    print(f"\n{kind}: weights {weights / GIB:.2f} GiB, load peak {peak / GIB:.2f} GiB")
    assert all(isinstance(m, QuantLinear) for m in _projections(model))
    assert peak < max_gib * GIB
    del model
    torch.cuda.empty_cache()
