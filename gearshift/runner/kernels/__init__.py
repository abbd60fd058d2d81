"""Triton kernels of the model runner (sample.py: the fused sampling pass of sampler.sample)."""
