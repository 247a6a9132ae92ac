"""The model runner and every device concern it owns: input preparation, the forward context,
attention backends, CUDA graphs, sampling, the pending step, warm-up and the count of kernels
compiled."""
