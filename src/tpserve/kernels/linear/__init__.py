"""Dense ops: the 16-bit decode GEMV, the clamped SwiGLU, the drafter's argmax with its probability."""
