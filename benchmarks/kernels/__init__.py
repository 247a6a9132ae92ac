"""Kernel benchmarks for contributors: one kernel (or one chain of them) timed against the copy
bandwidth or matmul rate measured in the same run (`python -m benchmarks.kernels.NAME`)."""
