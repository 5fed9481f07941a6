"""CPU emulation of what one GPU lane does, for the CUDA kernels' layout tests (kernels/quant/gemv_cuda.py,
kernels/quant/nvfp4_m1_cuda.py): PTX's prmt, bf16 bits, and the m16n8k16 MMA over its fragment layout."""

import struct

import torch


def prmt2(a: int, b: int, sel: int) -> int:
    """prmt.b32 d, a, b, sel: byte i of d is byte (sel nibble i & 7) of {b:a}, or its sign replicated (bit 3)."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nib = (sel >> (4 * i)) & 0xF
        v = src[nib & 7]
        out |= ((0xFF if v & 0x80 else 0) if nib & 8 else v) << (8 * i)
    return out


def bf16(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def decode_fp4(w: int, t: dict) -> list[int]:
    """kernels/quant/gemv_cuda.py's decode_fp4: 8 e2m1 codes (w, low nibble first) -> 4 bf16x2 (k, k + 1) pairs: prmt
    lookups of the magnitudes' bf16 bytes in the tables t (quant/ptx_cuda.fp4_tables), the signs ORed into the high
    bytes from (w << 4, w), the bytes interleaved."""
    m, s4 = w & 0x77777777, (w << 4) & 0xFFFFFFFF
    mh = m >> 16
    hi_a = prmt2(t["FP4_HI0"], t["FP4_HI1"], m) | (prmt2(s4, w, 0x5140) & 0x80808080)
    hi_b = prmt2(t["FP4_HI0"], t["FP4_HI1"], mh) | (prmt2(s4, w, 0x7362) & 0x80808080)
    lo_a, lo_b = prmt2(t["FP4_LO0"], t["FP4_LO1"], m), prmt2(t["FP4_LO0"], t["FP4_LO1"], mh)
    return [prmt2(lo_a, hi_a, 0x5140), prmt2(lo_a, hi_a, 0x7362), prmt2(lo_b, hi_b, 0x5140),
            prmt2(lo_b, hi_b, 0x7362)]


def mma16816(a_regs, b_regs, dtype: torch.dtype = torch.float32):
    """m16n8k16 (row.col) per the PTX fragment layout: lane (g = lane // 4, c = lane % 4) holds A[g][2c, 2c+1],
    A[g+8][2c, 2c+1], A[g][2c+8, 2c+9], A[g+8][2c+8, 2c+9] and B[2c, 2c+1][g], B[2c+8, 2c+9][g]; -> D [16, 8]."""
    a, b = torch.zeros(16, 16, dtype=dtype), torch.zeros(16, 8, dtype=dtype)
    for lane in range(32):
        g, c = divmod(lane, 4)
        for (row, col), pair in zip(((g, 2 * c), (g + 8, 2 * c), (g, 2 * c + 8), (g + 8, 2 * c + 8)), a_regs[lane]):
            a[row, col:col + 2] = torch.tensor(pair, dtype=dtype)
        for (k, pair) in zip((2 * c, 2 * c + 8), b_regs[lane]):
            b[k:k + 2, g] = torch.tensor(pair, dtype=dtype)
    return a @ b
