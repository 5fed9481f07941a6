"""Quantized weights: reference quantize / dequantize, the dispatch table, Triton and CUDA GEMVs / GEMMs."""
