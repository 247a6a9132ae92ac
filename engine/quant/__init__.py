"""Weight-only quantization (int8 per row, int4 NF4/FP4 per group): the format, the references,
bitsandbytes, the modules and their start-up kernel choices.

- format.py: WeightQuant (how weights are stored), QuantizedWeight (one quantized weight, the
  value that travels), the int4 group-size rule, resolve_weight_quant and a checkpoint's
  quantization_config. Torch-free at import, so the memory planner can read it.
- reference.py: the pure-PyTorch dequantization and matmul every kernel is tested against.
- bnb.py: bitsandbytes' quantizers, its code tables, and the reader of checkpoints it wrote.
- dispatch.py: the one row-count table of which kernel serves a quantized linear.
- modules.py: QuantLinear, QuantEmbedding and quantize_model (the swap of a model's layers).
- tuning.py: QuantChoices (one engine's timed choices, per weight shape) and the timing.

Dependencies point one way: engine.models -> engine.quant -> engine.kernels. Nothing is
imported here, so `engine.quant.weight_format` loads without torch.
"""
