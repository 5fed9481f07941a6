"""Quantized decode GEMVs on the tensor cores, in CUDA (NVRTC): y [M <= 8, N] = x [M, K] @ dequant(W)^T, W FP8
block-128 [N, K] or NVFP4 [N, K/2].

Why CUDA, not Triton: at 2-8 rows every Triton form of the FP8 GEMV (BENCHMARKS.md, seventeenth to twentieth
sessions) spent ~6.4 SASS instructions a weight decoding and moving the tile between layouts for `tl.dot`, and
stalled near 19 us on 12288 x 4096 (59% of the 11.7 us floor). Here each lane loads its own weights straight into
the registers an `mma.sync.m16n8k16` A fragment needs, so nothing goes through shared memory:

- A warp owns 16 rows of W (a row tile; `rows` tiles) and some 128-byte chunks of each row. The 8 rows of x are
  the MMA's n = 8 columns (rows of x past M are zeros), so M = 1..8 cost the same.
- Lane (g = lane / 4, c = lane % 4) loads 16 contiguous bytes of rows g and g + 8 at byte 16 c of each 64-byte
  half of a chunk, and x row g's values at the same k. The MMA's k order within a chunk is free as long as A and
  B agree, so each MMA takes 32-bit words of the lane's own loads and the matching x words: no shuffles, and W is
  the checkpoint's row-major layout.
- FP8: e4m3 -> bf16 is one `prmt` per pair of values ([b0, sign(b0), b1, sign(b1)]), then (v << 4) & 0x87F087F0:
  the bf16 with e4m3's sign, exponent and mantissa bits, exactly the e4m3 value times 2^-120 (subnormals too:
  both formats' subnormals scale alike). x is multiplied by 2^60 (exact in bf16 for |x| < 2^67), so products land
  at 2^-60 times their value, inside fp32's normal range; the 2^60 rides on the block scale. Each 128 x 128 scale
  block's MMA sums go into a fresh accumulator, scaled once into the total.
- NVFP4: 8 e2m1 codes (a 32-bit word) -> 4 bf16x2 in k order: the magnitudes' bf16 high and low bytes looked up
  with `prmt` (8-entry byte tables), the signs ORed into the high bytes, the bytes interleaved; then times the
  16-value group's e4m3 scale, in bf16 (exact: 2 and 4 significant bits); the per-row global scale on the output.
- The K chunks are split over the block's warps (their sums meet in shared memory), `interleave`d: warp w takes
  chunks w, w + splits, ... so the block reads adjacent chunks of each row together (longer DRAM runs: on an H200
  FP8 at 8 rows took 14.5 us interleaved, at least 16.1 us not); each warp keeps depth - 1 chunks' loads in flight.

sm_90 SASS (`bench/mma_gemv_sass.py`): ~2 instructions a weight for FP8, ~3 for NVFP4. e4m3's NaN codes (0x7F,
0xFF) decode to finite values; checkpoints carry none. Needs sm_80+ (bf16 mma.sync) and NVRTC (PyTorch's CUDA
builds bring it); `available` says whether it compiles here.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass

import torch

from tpserve.kernels.launch import ex_cuda as launch_ex

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

_SOURCE = r"""
#define ROWS_PER_WARP (16 * R)
#define CHUNK(i) (INTERLEAVE ? (i) * KS + warp : (i))  // the i-th of a warp's K chunks

struct Chunk { uint4 lo[R][2], hi[R][2]; };  // W only: [row tile][64-wide half of the 128 block]

// W streams through once: not kept in L1 (x, read by every warp, stays there); W_HINT may ask L2 to fetch the
// rest of a 256-byte run with the first 16 bytes
__device__ __forceinline__ uint4 ldg_w(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate" W_HINT ".v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ void load(Chunk& ch, const unsigned char* const* wlo, const unsigned char* const* whi,
                                     long k) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      ch.lo[r][h] = ldg_w(wlo[r] + k + 64 * h);
      ch.hi[r][h] = ldg_w(whi[r] + k + 64 * h);
    }
  }
}

#if ASYNC
// STAGE: W through shared memory (cp.async), a warp's ring of DEPTH chunks, [slot][row tile][half][lo|hi][lane]
// uint4: each lane copies and reads back only its own 16-byte pieces, so no barrier is needed between them
__device__ __forceinline__ void cp16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global" W_HINT " [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void load_async(unsigned ring, int slot, const unsigned char* const* wlo,
                                           const unsigned char* const* whi, long k, int lane) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      cp16(ring + (((((slot * R + r) * 2 + h) * 2 + 0) * 32 + lane) << 4), wlo[r] + k + 64 * h);
      cp16(ring + (((((slot * R + r) * 2 + h) * 2 + 1) * 32 + lane) << 4), whi[r] + k + 64 * h);
    }
  }
}

__device__ __forceinline__ void read_chunk(Chunk& ch, const uint4* ring, int slot, int lane) {
#pragma unroll
  for (int h = 0; h < 2; h++) {
#pragma unroll
    for (int r = 0; r < R; r++) {
      ch.lo[r][h] = ring[(((slot * R + r) * 2 + h) * 2 + 0) * 32 + lane];
      ch.hi[r][h] = ring[(((slot * R + r) * 2 + h) * 2 + 1) * 32 + lane];
    }
  }
}
#endif

// one 128-wide scale block: x's 128 values (loaded here: L1 hits after the first warp) against the chunk's W
__device__ __forceinline__ void compute(const Chunk& ch, float (*acc)[4], const float* const* srow,
                                        const unsigned short* xrow, bool x_ok, long kb) {
  uint4 xv[2][2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    xv[h][0] = x_ok ? ldg_x(xrow + (kb << 7) + 64 * h) : make_uint4(0, 0, 0, 0);
    xv[h][1] = x_ok ? ldg_x(xrow + (kb << 7) + 64 * h + 8) : make_uint4(0, 0, 0, 0);
  }
  float part[R][4];
#pragma unroll
  for (int r = 0; r < R; r++) part[r][0] = part[r][1] = part[r][2] = part[r][3] = 0.f;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    unsigned b[8];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      b[i] = scale_x(word(xv[h][0], i));
      b[4 + i] = scale_x(word(xv[h][1], i));
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
      for (int r = 0; r < R; r++) {
        unsigned lo = word(ch.lo[r][h], j), hi = word(ch.hi[r][h], j);
        mma(part[r], decode2(lo, SEL_LO), decode2(hi, SEL_LO), decode2(lo, SEL_HI), decode2(hi, SEL_HI), b[2 * j],
            b[2 * j + 1]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    float s = __ldg(srow[r] + kb) * 1152921504606846976.0f;  // 2^60 (X_SCALE_LOG2)
#pragma unroll
    for (int i = 0; i < 4; i++) acc[r][i] += part[r][i] * s;
  }
}

// two e4m3 block scales (a 16-bit load) -> bf16x2 (s0, s0) and (s1, s1), exact
__device__ __forceinline__ void scales_fp4(const unsigned char* p, unsigned& s0, unsigned& s1) {
  unsigned short u;
  asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(u) : "l"(p));
  const unsigned v = mul_bf16x2((prmt(u, u, SEL_LO) << DECODE_SHIFT) & DECODE_MASK, 0x7B807B80u);  // * 2^120
  s0 = prmt(v, v, 0x1010u);
  s1 = prmt(v, v, 0x3232u);
}

// one 256-wide K chunk of NVFP4: thread c's 16 bytes of a half are k = 128 h + 32 c + 8 j + 0..7 (word j), in
// scale groups 2c (words 0, 1) and 2c + 1 (words 2, 3); each word's two MMAs take its k pairs (0,1)(2,3) and
// (4,5)(6,7) against x's matching words
__device__ __forceinline__ void compute_fp4(const Chunk& ch, float (*acc)[4], const unsigned char* const* slo,
                                            const unsigned char* const* shi, const unsigned short* xrow, bool x_ok,
                                            long kb) {
  const unsigned FP4_T[4] = {FP4_HI0, FP4_HI1, FP4_LO0, FP4_LO1};
#pragma unroll
  for (int h = 0; h < 2; h++) {
    uint4 xv[4];
#pragma unroll
    for (int i = 0; i < 4; i++) xv[i] = x_ok ? ldg_x(xrow + (kb << 8) + 128 * h + 8 * i) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int r = 0; r < R; r++) {
      unsigned sl[2], sh[2];
      scales_fp4(slo[r] + (kb << 4) + 8 * h, sl[0], sl[1]);
      scales_fp4(shi[r] + (kb << 4) + 8 * h, sh[0], sh[1]);
#pragma unroll
      for (int j = 0; j < 4; j++) {
        unsigned a[4], b[4];
        decode_fp4(word(ch.lo[r][h], j), a, FP4_T);
        decode_fp4(word(ch.hi[r][h], j), b, FP4_T);
#pragma unroll
        for (int i = 0; i < 4; i++) {
          a[i] = mul_bf16x2(a[i], sl[j >> 1]);
          b[i] = mul_bf16x2(b[i], sh[j >> 1]);
        }
        mma(acc[r], a[0], b[0], a[1], b[1], xv[j].x, xv[j].y);
        mma(acc[r], a[2], b[2], a[3], b[3], xv[j].z, xv[j].w);
      }
    }
  }
}

// FP8: s float32 block scales [ceil(N / BNS), SK = K / 128]; NVFP4: s e4m3 [N, SK = K / 16], s2 float32 [N]
extern "C" __global__ void __launch_bounds__(LAUNCH_BOUNDS) NAME(
    const unsigned char* __restrict__ w, const void* __restrict__ s, const float* __restrict__ s2,
    const unsigned short* __restrict__ x, unsigned short* __restrict__ y, int M, int N, int K, int SK, int BNS) {
  __shared__ float red[KS > 1 ? KS - 1 : 1][R][4][32];
#if PDL && __CUDA_ARCH__ >= 900
  // programmatic dependent launch (kernels/launch/ex_cuda.py): the next kernel may launch now; W's first chunks load
  // (weights: no kernel writes them) before the wait for the kernel before, whose output x may be
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int row0 = blockIdx.x * ROWS_PER_WARP;
  const long row_bytes = FP4 ? K / 2 : K;  // a K chunk is 128 bytes of a row: 128 FP8 or 256 NVFP4 values
  const unsigned char* wlo[R];
  const unsigned char* whi[R];
  const float* srow[R];  // FP8: the row tile's scale row
  const unsigned char* slo[R];  // NVFP4: rows g and g + 8's block scales, at thread c's first group
  const unsigned char* shi[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    int lo = min(row0 + 16 * r + g, N - 1), hi = min(row0 + 16 * r + g + 8, N - 1);
    wlo[r] = w + lo * row_bytes + 16 * c;
    whi[r] = w + hi * row_bytes + 16 * c;
    srow[r] = (const float*)s + (long)(min(row0 + 16 * r, N - 1) / BNS) * SK;
    slo[r] = (const unsigned char*)s + (long)lo * SK + 2 * c;
    shi[r] = (const unsigned char*)s + (long)hi * SK + 2 * c;
  }
  const bool x_ok = g < M;  // (x's rows past M are the MMA's zero columns)
  const unsigned short* xrow = x + (long)(x_ok ? g : 0) * K + (FP4 ? 32 : 16) * c;
  // a warp's K chunks: a contiguous share (INTERLEAVE 0), or every KS-th chunk from its own (the block's warps
  // then read KS adjacent chunks of each row at about the same time: longer runs for DRAM)
  const int nkb = (int)(row_bytes >> 7);
  const int kb0 = INTERLEAVE ? 0 : warp * nkb / KS, kb1 = INTERLEAVE ? (nkb - warp + KS - 1) / KS
                                                                      : (warp + 1) * nkb / KS;
  float acc[R][4];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.f;
#if ASYNC
  extern __shared__ __align__(16) uint4 wring[];
  const uint4* ringp = wring + warp * (DEPTH * R * 128);
  const unsigned ring = (unsigned)__cvta_generic_to_shared(ringp);
#pragma unroll
  for (int d = 0; d < DEPTH - 1; d++) {
    if (kb0 + d < kb1) load_async(ring, d, wlo, whi, (long)CHUNK(kb0 + d) << 7, lane);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
#if PDL && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  for (int i = 0; kb0 + i < kb1; i++) {
    const int cur = kb0 + i, nxt = cur + DEPTH - 1;
    if (nxt < kb1) load_async(ring, (i + DEPTH - 1) % DEPTH, wlo, whi, (long)CHUNK(nxt) << 7, lane);
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group %0;" :: "n"(DEPTH - 1) : "memory");  // chunk cur has landed
    Chunk ch;
    read_chunk(ch, ringp, i % DEPTH, lane);
    if (FP4)
      compute_fp4(ch, acc, slo, shi, xrow, x_ok, CHUNK(cur));
    else
      compute(ch, acc, srow, xrow, x_ok, CHUNK(cur));
  }
#else
  Chunk buf[DEPTH];
#pragma unroll
  for (int d = 0; d < DEPTH - 1; d++)
    if (kb0 + d < kb1) load(buf[d], wlo, whi, (long)CHUNK(kb0 + d) << 7);
#if PDL && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  for (int kb = kb0; kb < kb1; kb += DEPTH) {
#pragma unroll
    for (int d = 0; d < DEPTH; d++) {
      const int cur = kb + d, nxt = cur + DEPTH - 1;
      if (cur < kb1) {
        if (nxt < kb1) load(buf[(d + DEPTH - 1) % DEPTH], wlo, whi, (long)CHUNK(nxt) << 7);
        if (FP4)
          compute_fp4(buf[d], acc, slo, shi, xrow, x_ok, CHUNK(cur));
        else
          compute(buf[d], acc, srow, xrow, x_ok, CHUNK(cur));
      }
    }
  }
#endif
  if (KS > 1) {
    if (warp > 0) {
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp - 1][r][i][lane] = acc[r][i];
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int v = 0; v < KS - 1; v++)
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[r][i] += red[v][r][i][lane];
  }
  // acc[r]: rows (row0 + 16 r + g, + 8) x columns (x rows 2c, 2c + 1)
#pragma unroll
  for (int r = 0; r < R; r++) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int n = row0 + 16 * r + g + 8 * (i >> 1), m = 2 * c + (i & 1);
      if (n < N && m < M) y[(long)m * N + n] = to_bf16(FP4 ? acc[r][i] * __ldg(s2 + n) : acc[r][i]);
    }
  }
}
"""


@dataclass(frozen=True)
class Config:
    """fmt: "fp8" or "nvfp4"; rows: row tiles (16 rows of W) per warp; splits: warps per block, each over its
    share of K (the block's row tiles are the same); depth: K chunks (128 bytes of a row) of W a warp holds,
    depth - 1 of them loading ahead; l2_prefetch: bytes L2 fetches with each W load (0: no hint); interleave: a
    warp takes every splits-th K chunk (else a contiguous share of them); min_blocks: blocks an SM must hold at once
    (`__launch_bounds__`' second argument, ptxas then caps the registers to fit them; 0: not given. Given as 1 it
    let ptxas use 246 registers for the NVFP4 default, 164 without: slower on an H200, BENCHMARKS.md); stage: W
    loads "regs" (straight into registers, depth chunks a warp) or "smem" (`cp.async` into a ring of depth chunks
    in shared memory, depth x rows x 2 KiB a warp: the bytes in flight then cost no registers). (A third stage, a
    producer warp's bulk copies (TMA) into a block-wide ring, measured slower everywhere: BENCHMARKS.md,
    twenty-seventh session; its code is at 125ad2f.) max_blocks: blocks an SM may hold at once (0: as many as fit):
    the launch asks for unused shared memory enough that no more fit (`launch_ex.capped_smem`); PDL launches of
    regs configs take `launch_ex.one_wave_cap` unless given one."""
    fmt: str = "fp8"
    rows: int = 1
    splits: int = 2
    depth: int = 2
    l2_prefetch: int = 0
    interleave: bool = False
    min_blocks: int = 0
    stage: str = "regs"
    max_blocks: int = 0

    def __post_init__(self):
        if self.stage not in ("regs", "smem"):
            raise ValueError(f"Config.stage: must be 'regs' or 'smem', got {self.stage!r}")
        if not isinstance(self.interleave, bool):
            raise ValueError(f"Config.interleave: must be a bool, got {self.interleave!r}")
        if self.fmt not in ("fp8", "nvfp4"):
            raise ValueError(f"Config.fmt: must be 'fp8' or 'nvfp4', got {self.fmt!r}")
        if self.l2_prefetch not in (0, 64, 128, 256):
            raise ValueError(f"Config.l2_prefetch: must be 0, 64, 128 or 256 (bytes), got {self.l2_prefetch!r}")
        for name, lo, hi in (("rows", 1, 4), ("splits", 1, 16), ("depth", 2, 8),
                             ("min_blocks", 0, 8), ("max_blocks", 0, 8)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ValueError(f"Config.{name}: must be an int in {lo}..{hi}, got {v!r}")

    @property
    def name(self) -> str:
        return (f"tpserve_{self.fmt}_mma_gemv_r{self.rows}_s{self.splits}_d{self.depth}_p{self.l2_prefetch}"
                f"_i{int(self.interleave)}_b{self.min_blocks}" + ("_smem" if self.stage == "smem" else "")
                + (f"_m{self.max_blocks}" if self.max_blocks else ""))

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory a block uses: the warps' rings (stage "smem"), else none."""
        return self.splits * self.depth * self.rows * 2048 if self.stage == "smem" else 0


def kernel_name(cfg: Config, pdl: bool = False) -> str:
    """The kernel's name in `source(cfg, pdl)`."""
    return cfg.name + ("_pdl" if pdl else "")


def source(cfg: Config, pdl: bool = False) -> str:
    """The CUDA source of one configuration (its kernel is `kernel_name(cfg, pdl)`); pdl: the kernel signals
    `griddepcontrol.launch_dependents` first and waits (`griddepcontrol.wait`) after W's first chunks are issued,
    before it reads x (sm_90+; launched by kernels/launch/ex_cuda.launch_pdl)."""
    defines = dict(R=cfg.rows, KS=cfg.splits, DEPTH=cfg.depth, NAME=kernel_name(cfg, pdl), PDL=int(pdl),
                   FP4=int(cfg.fmt == "nvfp4"),
                   INTERLEAVE=int(cfg.interleave), ASYNC=int(cfg.stage == "smem"),
                   LAUNCH_BOUNDS=f"32 * KS, {cfg.min_blocks}" if cfg.min_blocks else "32 * KS",
                   SEL_LO=f"{SEL_LO:#x}u", SEL_HI=f"{SEL_HI:#x}u", DECODE_MASK=f"{DECODE_MASK:#x}u",
                   DECODE_SHIFT=DECODE_SHIFT, **{k: f"{v:#010x}u" for k, v in FP4_TABLES.items()},
                   W_HINT=f'".L2::{cfg.l2_prefetch}B"' if cfg.l2_prefetch else '""')
    return "".join(f"#define {k} {v}\n" for k, v in defines.items()) + DEVICE_HELPERS + _SOURCE


@functools.lru_cache(maxsize=None)
def _kernel(cfg: Config, arch: str, device: int, pdl: bool = False):
    """The compiled kernel, loaded into `device`'s context (a module belongs to the context it was loaded in)."""
    from torch.cuda import _compile_kernel  # NVRTC: PyTorch's own runtime compiler binding

    with torch.cuda.device(device):
        return _compile_kernel(source(cfg, pdl), kernel_name(cfg, pdl), compute_capability=arch)


def available(x: torch.Tensor) -> bool:
    """Whether these GEMVs can run for x: a CUDA device of sm_80 or later, and NVRTC compiles the kernels there (a
    build without it is warned about once, and the Triton GEMVs run instead)."""
    if not x.is_cuda or torch.version.cuda is None:
        return False
    major, minor = torch.cuda.get_device_capability(x.device)
    return major >= 8 and _compiles(f"{major}{minor}", x.device.index or 0)


@functools.lru_cache(maxsize=None)
def _compiles(arch: str, device: int) -> bool:
    try:
        _kernel(Config(), arch, device)
    except (AttributeError, ImportError, OSError, RuntimeError) as exc:
        warnings.warn(f"kernels/mma_gemv: NVRTC could not build the GEMVs for sm_{arch} ({exc}); the Triton "
                      "GEMVs run instead", RuntimeWarning, stacklevel=3)
        return False
    return True


def fits(m: int, k: int, dtype: torch.dtype, block: tuple[int, int] | None = None) -> bool:
    """Shapes these GEMVs take: 1..8 rows of bf16 x; FP8 (block given): K whole 128-wide scale blocks and row
    scale blocks whole 16-row tiles; NVFP4 (block None): K a multiple of 256."""
    if not (1 <= m <= 8 and dtype == torch.bfloat16):
        return False
    return k % 256 == 0 if block is None else k % 128 == 0 and block[1] == 128 and block[0] % 16 == 0


def usable(x: torch.Tensor, block: tuple[int, int] | None = None) -> bool:
    """These GEMVs take x (fits; `block` as there) and can run (available)."""
    return fits(x.shape[0], x.shape[1], x.dtype, block) and available(x)


def default_config(fmt: str, n: int, k: int) -> Config:
    """The H200 sweeps' best (bench/quant_decode_sweep.py --sections mma,mma2; BENCHMARKS.md, twenty-third session),
    K chunks interleaved over the block's warps and L2 fetching 256 bytes a load in both: on 12288 x 4096 two row
    tiles a warp, 4 warps a block (FP8 14.5 us at 8 rows, 81% of the floor; NVFP4 14.1); on 4096 x 12288 one
    row tile, 8 warps (FP8 15.0-15.2, 77-78%; NVFP4 17.8). Other shapes take the config of the nearer of the two
    by row count (N >= 8192: the first)."""
    if n >= 8192:
        return Config(fmt, rows=2, splits=4, depth=2, l2_prefetch=256, interleave=True)
    return Config(fmt, rows=1, splits=8, depth=2, l2_prefetch=256, interleave=True)


def _check(x: torch.Tensor, w: torch.Tensor, k_of_w: int, fmt: str, block) -> None:
    if not (x.is_cuda and w.is_cuda):
        raise ValueError(f"x: must be a CUDA tensor, as w (got {x.device}, {w.device})")
    if x.dim() != 2 or k_of_w != x.shape[1]:
        raise ValueError(f"x: must be [M, K] with K = {k_of_w} (w's), got {tuple(x.shape)}")
    if not fits(x.shape[0], x.shape[1], x.dtype, block):
        raise ValueError(f"{fmt}_gemv: takes 1..8 bf16 rows of x and K a multiple of "
                         f"{'128 (scale blocks (16 j, 128))' if block else 256}; got x {tuple(x.shape)} {x.dtype}"
                         + (f", block {tuple(block)}" if block else ""))


def _aligned(t: torch.Tensor, boundary: int) -> torch.Tensor:
    """t contiguous at an address the kernel's loads of it need (16 bytes for W's and x's vector loads, the element
    size for the scales): a view into a larger tensor may start anywhere, and is copied then. (Asking the scales
    for 16 bytes too cost the built-in model's FP8 decode ~10% on an H200: the engine's scales are not 16-byte
    aligned, so every call copied them; BENCHMARKS.md, twenty-third session.)"""
    t = t.contiguous()
    return t if t.data_ptr() % boundary == 0 else t.clone()


def _launch(cfg: Config, w, s, s2, x, n: int, sk: int, bns: int, pdl: bool = False) -> torch.Tensor:
    m, k = x.shape
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if n == 0:
        return y
    w, x, s, s2 = _aligned(w, 16), _aligned(x, 16), _aligned(s, 2 if s.dtype == torch.uint8 else 4), _aligned(s2, 4)
    device = x.device.index
    if device != torch.cuda.current_device():  # (the launch goes to the current device's current stream)
        raise ValueError(f"x: on cuda:{device}, but the current device is cuda:{torch.cuda.current_device()} "
                         "(call inside `with torch.cuda.device(...)`)")
    major, minor = torch.cuda.get_device_capability(device)
    pdl = pdl and launch_ex.supported(x.device)
    if pdl and cfg.stage == "regs" and not cfg.max_blocks:
        cfg = dataclasses.replace(cfg, max_blocks=launch_ex.one_wave_cap(-(-n // (16 * cfg.rows)),
                                                                         launch_ex.sms(device)))
    kernel, smem = _kernel(cfg, f"{major}{minor}", device, pdl), cfg.smem_bytes
    if cfg.max_blocks:  # (cap_blocks opts the kernel in to the bytes it asks for)
        smem = launch_ex.cap_blocks(kernel, device, smem, cfg.max_blocks)
    else:
        launch_ex.reserve_smem(kernel, smem)
    grid, block = (-(-n // (16 * cfg.rows)), 1, 1), (32 * cfg.splits, 1, 1)
    args = [w.view(torch.uint8), s, s2, x.view(torch.int16), y.view(torch.int16), m, n, k, sk, bns]
    if pdl:
        launch_ex.launch_pdl(kernel, grid, block, smem, args)
    else:
        kernel(grid=grid, block=block, shared_mem=smem, args=args)
    return y


def fp8_gemv(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, block: tuple[int, int] = (128, 128),
             cfg: Config | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M <= 8, K] bf16 (CUDA) @ dequant(w float8_e4m3fn [N, K], s float32 [ceil(N / block[0]), K / 128])^T
    -> y [M, N] bf16. pdl: launched as a programmatic dependent of the kernel before (sm_90+; else plainly): W's
    first chunks load before that kernel ends (`source`), and a regs config without max_blocks takes
    `launch_ex.one_wave_cap`."""
    n, k = w.shape
    _check(x, w, k, "fp8", block)
    if w.dtype != torch.float8_e4m3fn:
        raise ValueError(f"w: must be float8_e4m3fn, got {w.dtype}")
    if tuple(s.shape) != (-(-n // block[0]), k // 128) or s.dtype != torch.float32:
        raise ValueError(f"s: must be float32 [{-(-n // block[0])}, {k // 128}], got {s.dtype} {tuple(s.shape)}")
    cfg = cfg or default_config("fp8", n, k)
    if cfg.fmt != "fp8":
        raise ValueError(f"cfg: an fp8 config, got {cfg.fmt!r}")
    return _launch(cfg, w, s, s, x, n, s.shape[1], block[0], pdl)


def nvfp4_gemv(x: torch.Tensor, w: torch.Tensor, bscale: torch.Tensor, scale2_rows: torch.Tensor,
               cfg: Config | None = None, pdl: bool = False) -> torch.Tensor:
    """x [M <= 8, K] bf16 (CUDA) @ dequant(w uint8 [N, K/2] (low nibble = even k), bscale float8_e4m3fn
    [N, K/16], scale2_rows float32 [N])^T -> y [M, N] bf16. pdl: as fp8_gemv."""
    n, k = w.shape[0], 2 * w.shape[1]
    _check(x, w, k, "nvfp4", None)
    if w.dtype != torch.uint8:
        raise ValueError(f"w: must be uint8 (two e2m1 codes a byte), got {w.dtype}")
    if tuple(bscale.shape) != (n, k // 16) or bscale.dtype != torch.float8_e4m3fn:
        raise ValueError(f"bscale: must be float8_e4m3fn [{n}, {k // 16}], got {bscale.dtype} {tuple(bscale.shape)}")
    if tuple(scale2_rows.shape) != (n,):
        raise ValueError(f"scale2_rows: must be [{n}], got {tuple(scale2_rows.shape)}")
    cfg = cfg or default_config("nvfp4", n, k)
    if cfg.fmt != "nvfp4":
        raise ValueError(f"cfg: an nvfp4 config, got {cfg.fmt!r}")
    return _launch(cfg, w, bscale.contiguous().view(torch.uint8), scale2_rows.float(), x, n, k // 16, 1, pdl)
