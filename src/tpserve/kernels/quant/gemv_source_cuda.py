"""The CUDA source of the quantized decode GEMV (gemv_cuda.py compiles and launches it): y [M <= 8, N] =
x [M, K] @ dequant(W)^T, W FP8 block-128 [N, K] or NVFP4 [N, K/2], on the tensor cores.

Each lane loads its own weights straight into the registers an `mma.sync.m16n8k16` A fragment needs, so nothing
goes through shared memory (the Triton forms spent most of their instructions moving the tile between layouts
for `tl.dot`):

- A warp owns 16 rows of W (a row tile; `rows` tiles) and some 128-byte chunks of each row. The 8 rows of x are
  the MMA's n = 8 columns (rows of x past M are zeros), so M = 1..8 cost the same.
- Lane (g = lane / 4, c = lane % 4) loads 16 contiguous bytes of rows g and g + 8 at byte 16 c of each 64-byte
  half of a chunk, and x row g's values at the same k. The MMA's k order within a chunk is free as long as A and
  B agree, so each MMA takes 32-bit words of the lane's own loads and the matching x words: no shuffles, and W is
  the checkpoint's row-major layout.
- FP8: e4m3 decoded by ptx_cuda.py's `decode2` (value times 2^-120); x is multiplied by 2^60 (exact in bf16 for
  |x| < 2^67), so products land at 2^-60 times their value, inside fp32's normal range; the 2^60 rides on the
  block scale. Each 128 x 128 scale block's MMA sums go into a fresh accumulator, scaled once into the total.
- NVFP4: `decode_fp4`, then times the 16-value group's e4m3 scale, in bf16 (exact: 2 and 4 significant bits); the
  per-row global scale on the output.
- The K chunks are split over the block's warps (their sums meet in shared memory), `interleave`d: warp w takes
  chunks w, w + splits, ... so the block reads adjacent chunks of each row together (longer DRAM runs); each warp
  keeps depth - 1 chunks' loads in flight.

sm_90 SASS (`bench/mma_gemv_sass.py`): ~2 instructions a weight for FP8, ~3 for NVFP4.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpserve.kernels.quant.ptx_cuda import DECODE_MASK, DECODE_SHIFT, DEVICE_HELPERS, FP4_TABLES, SEL_HI, SEL_LO

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
    (`__launch_bounds__`' second argument, ptxas then caps the registers to fit them; 0: not given); stage: W
    loads "regs" (straight into registers, depth chunks a warp) or "smem" (`cp.async` into a ring of depth chunks
    in shared memory, depth x rows x 2 KiB a warp: the bytes in flight then cost no registers; measured slower,
    not a default); max_blocks: blocks an SM may hold at once (0: as many as fit): the launch asks for unused
    shared memory enough that no more fit (`ex_cuda.capped_smem`); PDL launches of regs configs take
    `ex_cuda.one_wave_cap` unless given one."""
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
    before it reads x (sm_90+; launched by launch/ex_cuda.launch_pdl)."""
    defines = dict(R=cfg.rows, KS=cfg.splits, DEPTH=cfg.depth, NAME=kernel_name(cfg, pdl), PDL=int(pdl),
                   FP4=int(cfg.fmt == "nvfp4"),
                   INTERLEAVE=int(cfg.interleave), ASYNC=int(cfg.stage == "smem"),
                   LAUNCH_BOUNDS=f"32 * KS, {cfg.min_blocks}" if cfg.min_blocks else "32 * KS",
                   SEL_LO=f"{SEL_LO:#x}u", SEL_HI=f"{SEL_HI:#x}u", DECODE_MASK=f"{DECODE_MASK:#x}u",
                   DECODE_SHIFT=DECODE_SHIFT, **{k: f"{v:#010x}u" for k, v in FP4_TABLES.items()},
                   W_HINT=f'".L2::{cfg.l2_prefetch}B"' if cfg.l2_prefetch else '""')
    return "".join(f"#define {k} {v}\n" for k, v in defines.items()) + DEVICE_HELPERS + _SOURCE
