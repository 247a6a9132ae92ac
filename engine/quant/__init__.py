"""Weight quantization (int8, int4 and fp8; quantized at load or read from checkpoints): the format,
the references, the checkpoint readers, the modules and their start-up kernel choices.

- weight_format.py: WeightQuant (how weights are stored), QuantizedWeight (one quantized
  weight, the value that travels), the int4 group-size rule. Torch-free at import, so the
  memory planner can read it.
- checkpoints.py: a checkpoint's quantization_config resolved to a WeightQuant (AWQ, GPTQ,
  compressed-tensors, FP8, bitsandbytes), refusals by name, resolve_weight_quant.
- formats/: each quantized checkpoint format converted at load into our layout.
- fp8.py: the FP8 matmul (W8A8 by torch._scaled_mm where the GPU has it, else weight-only).
- reference.py: the pure-PyTorch dequantization and matmul every kernel is tested against.
- bnb.py: bitsandbytes' quantizers, its code tables, and the reader of checkpoints it wrote.
- dispatch.py: the one row-count table of which kernel serves a quantized linear.
- modules.py: QuantLinear, QuantEmbedding and quantize_model (the swap of a model's layers).
- quant_choices.py: QuantChoices (one engine's timed choices, per weight shape) and the timing.

Dependencies point one way: engine.models -> engine.quant -> engine.kernels. Nothing is
imported here, so `engine.quant.weight_format` loads without torch.
"""
