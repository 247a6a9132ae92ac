"""Attention kernels: pure-PyTorch references (torch_ref) and Triton kernels for CUDA."""
