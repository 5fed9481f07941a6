"""What the two NVRTC kernels (gemv_source_cuda.py, nvfp4_m1_source_cuda.py) share: device helpers for the
bf16 tensor cores (mma.sync m16n8k16), the prmt-based e4m3 -> bf16 decode and the e2m1 table lookups, with their
constants.

e4m3 -> bf16 is one `prmt` per pair of values ([b0, sign(b0), b1, sign(b1)]), then (v << 4) & 0x87F087F0: the
bf16 with e4m3's sign, exponent and mantissa bits, exactly the e4m3 value times 2^-120 (subnormals too: both
formats' subnormals scale alike). e4m3's NaN codes (0x7F, 0xFF) decode to finite values; checkpoints carry none.
8 e2m1 codes (a 32-bit word) -> 4 bf16x2 in k order: the magnitudes' bf16 high and low bytes looked up with `prmt`
in 8-entry byte tables (`fp4_tables`), the signs ORed into the high bytes, the bytes interleaved.
"""

from __future__ import annotations

import torch

# prmt selectors: bytes [b0, sign(b0), b1, sign(b1)] and [b2, sign(b2), b3, sign(b3)] of a 32-bit word
SEL_LO, SEL_HI, DECODE_MASK, DECODE_SHIFT = 0x9180, 0xB3A2, 0x87F087F0, 4
W_OFFSET_LOG2, X_SCALE_LOG2 = -120, 60  # decoded weight = value * 2^-120; x * 2^60 before the MMA
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # e2m1 magnitudes, codes 0..7


def fp4_tables(log2_scale: int = 0) -> dict[str, int]:
    """`decode_fp4`'s prmt tables: the e2m1 magnitudes times 2^log2_scale as bf16, their high bytes (codes 0-3 in
    FP4_HI0, 4-7 in FP4_HI1, code i in byte i % 4) and low bytes (FP4_LO0, FP4_LO1)."""
    bits = [torch.tensor(v * 2.0**log2_scale, dtype=torch.bfloat16).view(torch.int16).item() & 0xFFFF for v in E2M1]
    pack = lambda vals: sum(b << (8 * i) for i, b in enumerate(vals))  # noqa: E731
    return dict(FP4_HI0=pack([b >> 8 for b in bits[:4]]), FP4_HI1=pack([b >> 8 for b in bits[4:]]),
                FP4_LO0=pack([b & 0xFF for b in bits[:4]]), FP4_LO1=pack([b & 0xFF for b in bits[4:]]))


FP4_TABLES = fp4_tables()

DEVICE_HELPERS = r"""
__device__ __forceinline__ unsigned decode2(unsigned w, unsigned sel) {
  unsigned v;
  asm("prmt.b32 %0, %1, %1, %2;" : "=r"(v) : "r"(w), "r"(sel));
  return (v << DECODE_SHIFT) & DECODE_MASK;
}

__device__ __forceinline__ unsigned scale_x(unsigned v) {  // bf16x2 * 2^60, exact
  unsigned r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(v), "r"(0x5D805D80u), "r"(0x80008000u));
  return r;
}

__device__ __forceinline__ void mma(float* d, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                    unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ldg_x(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::evict_last.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ unsigned word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b, unsigned sel) {
  unsigned v;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(v) : "r"(a), "r"(b), "r"(sel));
  return v;
}

__device__ __forceinline__ unsigned mul_bf16x2(unsigned a, unsigned b) {  // exact where the product fits bf16
  unsigned r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
  return r;
}

// 8 e2m1 codes (a 32-bit word, low nibble first) -> 4 bf16x2 in k order: the magnitudes' high and low bytes
// looked up with prmt in the 8-entry byte tables t (FP4_HI0, FP4_HI1, FP4_LO0, FP4_LO1), the signs ORed in, the
// bytes interleaved
__device__ __forceinline__ void decode_fp4(unsigned w, unsigned* r, const unsigned* t) {
  const unsigned m = w & 0x77777777u, mh = m >> 16, s4 = w << 4;
  const unsigned hi_a = prmt(t[0], t[1], m) | (prmt(s4, w, 0x5140u) & 0x80808080u);
  const unsigned hi_b = prmt(t[0], t[1], mh) | (prmt(s4, w, 0x7362u) & 0x80808080u);
  const unsigned lo_a = prmt(t[2], t[3], m), lo_b = prmt(t[2], t[3], mh);
  r[0] = prmt(lo_a, hi_a, 0x5140u);
  r[1] = prmt(lo_a, hi_a, 0x7362u);
  r[2] = prmt(lo_b, hi_b, 0x5140u);
  r[3] = prmt(lo_b, hi_b, 0x7362u);
}

__device__ __forceinline__ unsigned short to_bf16(float f) {
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

"""
