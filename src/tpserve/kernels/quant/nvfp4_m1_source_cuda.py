"""The CUDA source of the NVFP4 one-row kernels (nvfp4_m1_cuda.py compiles and launches them): the dense GEMV
y [1, N] = x [1, K] @ dequant(W)^T, and the MoE experts at decode, one (token, choice) pair at a time (each pair is
one row of x against its expert).

Three changes from gemv_source_cuda.py's NVFP4 GEMV (whose lane layout this keeps):

- **Group sums in the MMA's columns.** With one row of x, seven of the MMA's eight n columns carried zeros there.
  Here column j takes only the k slots of scale group j. A lane-quad c loads groups 2c and 2c + 1 of a 128-value
  half; each MMA takes four k pairs of one of them (32-bit words q of the lane's 16 bytes: q < 2 group 2c, else
  2c + 1), and lane (j, c) holds the matching x words in its B registers only where j is that group, zeros
  elsewhere (those lanes read 32 zero bytes instead of x: no masking). After the 8 MMAs of a half, lane (g, c)'s
  four accumulators are whole group sums, rows g and g + 8 by groups 2c and 2c + 1, and each takes its e4m3 scale
  in one FMA (0.06 operations a weight) instead of the bf16 multiply of every decoded pair (0.5).
- **Loads through shared memory** (`cp.async`, `stages` deep per warp): bytes in flight no longer cost registers.
  Each lane reads back only its own 16-byte pieces of W; the 16 scale bytes of a row and chunk arrive 4 bytes a
  lane and are read across the warp (a `__syncwarp` after each wait). x's row is staged once per block, every
  16-byte copy in flight at once (`cp.async`, one wait), then put in the order and scale the decode wants.
- **Two decodes** (Config.decode): "lut" is ptx_cuda.decode_fp4's prmt table lookups (tables times 2^60). "shift"
  moves each code's sign and 3 magnitude bits into a bf16 with shifts and masks (0.5 ALU operations a code fewer;
  left shifts as multiplies that may go to the FMA pipe): the value times 2^-126, the e = 0 codes as bf16
  subnormals, so it is exact only where the tensor cores keep subnormal inputs (checked on the GPU, tests).
  Nsight Compute found these kernels bound by the ALU pipe, not by DRAM. The scalings (TABLE_LOG2 and the
  SHIFT_* constants below) keep every product and sum in fp32's normal range; their unit 2^-60 rides on the
  global scale.

Experts: `experts` runs gate|up with SwiGLU (gate and up row tiles side by side in a warp, so a lane holds both
halves of its outputs) into h [pairs, I], then down times the routing weight into fp32 [pairs, D], then the
choices summed (route_triton.combine_choices); at one token the down kernel sums the choices itself ("down_sum":
a block a row tile, its warps taking (choice, chunk) items in turn). A pair whose expert id is outside [0, E)
contributes zeros. Every kernel issues its first W stages before staging x. gate|up writes h already in the order
and scale a "shift" down kernel takes (`source`'s h_shift), which stages it as it arrives.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpserve.kernels.quant.ptx_cuda import DECODE_MASK, DECODE_SHIFT, DEVICE_HELPERS, SEL_LO, fp4_tables

# Scalings that keep every product and sum in fp32's normal range (the unit 2^-60 rides on the global scale):
# "lut": e2m1 from prmt tables times 2^60, x as is, block scales at 2^-120 of their value;
# "shift": e2m1 bits shifted into a bf16's exponent and mantissa (value times 2^-126, the e = 0 codes as bf16
# subnormals), x times 2^66, block scales at their value.
TABLE_LOG2, SHIFT_W_LOG2, SHIFT_X_LOG2 = 60, -126, 66
# one row tile's chunk in a stage: W's 16 rows x 128 bytes (2 halves x lo|hi rows x 32 lanes x 16 bytes), then the
# 16 rows' 16 scale bytes
TILE_W_BYTES = 2 * 2 * 32 * 16
TILE_STAGE_BYTES = TILE_W_BYTES + 16 * 16

_SOURCE = r"""
#define HT (R / PARTS)  // row tiles of one part (gate or up) a warp holds
#define STAGE_BYTES (R * TILE_STAGE_BYTES)  // W [R][2 halves][lo|hi][32 lanes] uint4, then scales [R][lo|hi][8][16]
#define WARP_SMEM (STAGES * STAGE_BYTES)

__device__ __forceinline__ void cp16(unsigned dst, const void* src) {
  asm volatile("cp.async.cg.shared.global" W_HINT " [%0], [%1], 16;" :: "r"(dst), "l"(src));
}
__device__ __forceinline__ void cp16x(unsigned dst, const void* src) {  // (x: no L2 prefetch hint)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src));
}
__device__ __forceinline__ void cp4(unsigned dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dst), "l"(src));
}

// e4m3 pair (16 bits) -> two floats: "lut" value * 2^-120 (exact, subnormals too: fp32 denormals); "shift" the
// value (the bf16 pair times 2^120 first, exact)
__device__ __forceinline__ void scales2(unsigned u, float& f0, float& f1) {
  unsigned v = (prmt(u, u, SEL_LO) << DECODE_SHIFT) & DECODE_MASK;
  if (SHIFT) v = mul_bf16x2(v, 0x7B807B80u);
  f0 = __uint_as_float(v << 16);
  f1 = __uint_as_float(v & 0xFFFF0000u);
}

__device__ __forceinline__ unsigned scale_x66(unsigned v) { return mul_bf16x2(v, 0x60806080u); }  // * 2^66, exact

// x's 8 values as the "shift" decode pairs them, (0, 4), (1, 5), (2, 6), (3, 7), times 2^66 (exact)
__device__ __forceinline__ uint4 x_shift_order(uint4 v) {
  return make_uint4(scale_x66(prmt(v.x, v.z, 0x5410u)), scale_x66(prmt(v.x, v.z, 0x7632u)),
                    scale_x66(prmt(v.y, v.w, 0x5410u)), scale_x66(prmt(v.y, v.w, 0x7632u)));
}

// where x_shift_order puts value n of a row (a group of 8 holds values 0, 4, 1, 5, 2, 6, 3, 7 in that order)
__device__ __forceinline__ int x_shift_place(int n) { return (n & ~7) | ((n & 3) << 1) | ((n >> 2) & 1); }

// 8 e2m1 codes (low nibble first) -> 4 bf16x2, pair j = codes (j, j + 4), each value * 2^-126: the sign moved to
// bit 15 (31), the magnitude's 3 bits to bits 6-8 (22-24), the bf16's exponent LSBs and mantissa MSB. Left shifts
// as multiplies, which ptxas may issue on the FMA pipe (the ALU pipe, at half rate, is this kernel's limit).
__device__ __forceinline__ void decode_fp4_shift(unsigned w, unsigned* r) {
  r[0] = ((w * 4096u) & 0x80008000u) | ((w * 64u) & 0x01C001C0u);
  r[1] = ((w * 256u) & 0x80008000u) | ((w * 4u) & 0x01C001C0u);
  r[2] = ((w * 16u) & 0x80008000u) | ((w >> 2) & 0x01C001C0u);
  r[3] = (w & 0x80008000u) | ((w >> 6) & 0x01C001C0u);
}

// MODE 0: dense, y bf16 [N], s2 [N] per row. MODE 1: gate|up experts (PARTS 2), h bf16 [P, N] =
// silu(min(gate, limit)) * clamp(up, -limit, limit), W rows [0, N) gate and [N, 2N) up, s2 [E, 2].
// H_SHIFT: h written as a "shift" down kernel takes it (x_shift_order's order and scale), read there as is
// (X_IN_ORDER). MODE 2: down experts, y fp32 [P, N] = route[p] * (h[p] @ W^T), s2 [E, 1]. MODE 3: down experts
// summed over a token's choices, y bf16 [T, N] = sum_c route[t, c] * (h[t * top_k + c] @ W_c^T): a block's
// warps take the (choice, chunk) items in turn. w [E, rows, K/2] u8 codes, s [E, rows, K/16] e4m3; x [*, K] bf16
// (MODE 1: row p / top_k; MODE 2: row p; MODE 3: rows t * top_k .. + top_k; MODE 0: row 0); blockIdx.y: pair p
// (token t).
// Dynamic shared memory: KS warps' stages, then x's rows as the MMAs take them (K bf16 each), then 32 zero bytes.
extern "C" __global__ void __launch_bounds__(32 * KS) NAME(
    const unsigned char* __restrict__ w, const unsigned char* __restrict__ s, const float* __restrict__ s2,
    const unsigned short* __restrict__ x, const long long* __restrict__ ids, const float* __restrict__ route,
    void* __restrict__ y, int N, int K, int top_k, int num_experts,
    double limit_d) {  // (a double: torch's launcher passes Python floats as doubles)
  const float limit = (float)limit_d;
#if __CUDA_ARCH__ >= 900
  // programmatic dependent launch (kernels/launch/ex_cuda.py): gate|up lets down start as soon as all of its blocks run
  if (MODE == 1) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float red[KS > 1 ? KS - 1 : 1][R][2][8];
  __shared__ uint4 tab[32];
  __shared__ long long ch_e[MODE == 3 ? MAX_TOP_K : 1];  // MODE 3: each choice's expert (0 where out of range)
  __shared__ float ch_s[MODE == 3 ? MAX_TOP_K : 1];  // and its scale, route * s2 * 2^60 (0 out of range)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int p = blockIdx.y, row0 = blockIdx.x * 16 * HT;
  const float unit = 1152921504606846976.0f;  // 2^60 (TABLE_LOG2)
  const long long e = MODE == 0 || MODE == 3 ? 0 : ids[p];
  const bool e_ok = e >= 0 && e < num_experts;
  const long long ee = e_ok ? e : 0;
  const long rows_all = (long)N * PARTS, row_bytes = K / 2, SK = K / 16;
  const long expert_w = rows_all * row_bytes, expert_s = rows_all * SK;
  if (MODE == 3) {
    if (threadIdx.x < top_k) {
      const long long ec = ids[(long)p * top_k + threadIdx.x];
      const bool ok = ec >= 0 && ec < num_experts;
      ch_e[threadIdx.x] = ok ? ec : 0;
      ch_s[threadIdx.x] = ok ? route[(long)p * top_k + threadIdx.x] * s2[ok ? ec : 0] * unit : 0.f;
    }
    __syncthreads();
  }
  // this lane's rows g and g + 8 of each row tile (clamped: rows past N load row N - 1 and are not stored), as
  // offsets into an expert's W and scales
  long wlo[R], whi[R], slo[R], shi[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const long base = (long)(r / HT) * N;
    const int lo = min(row0 + 16 * (r % HT) + g, N - 1), hi = min(row0 + 16 * (r % HT) + g + 8, N - 1);
    wlo[r] = (base + lo) * row_bytes + 16 * c;
    whi[r] = (base + hi) * row_bytes + 16 * c;
    slo[r] = (base + lo) * SK + 4 * c;
    shi[r] = (base + hi) * SK + 4 * c;
  }
  unsigned char* ws = smem + warp * WARP_SMEM;
  const unsigned ws_addr = (unsigned)__cvta_generic_to_shared(ws);
  // 256-value chunks (MODE 3: (choice, chunk) items, choice-major): warp takes items warp, warp + KS, ...
  const int nkb = K >> 8, items = MODE == 3 ? top_k * nkb : nkb, nk = (items - warp + KS - 1) / KS;

  // stage layout: W at [r][h][lo|hi][lane] (16 bytes each), then scales at [r][lo|hi][g][16 bytes]
#define W_AT(st, r, h, q) ((st) * STAGE_BYTES + ((((r) * 2 + (h)) * 2 + (q)) * 32) * 16)
#define S_AT(st, r, q, gg) ((st) * STAGE_BYTES + R * TILE_W_BYTES + (((r) * 2 + (q)) * 8 + (gg)) * 16)
  auto issue = [&](int st, int it) {
    const int kb = MODE == 3 ? it % nkb : it;
    const long long ex = MODE == 3 ? ch_e[it / nkb] : ee;
    const unsigned char* we = w + ex * expert_w + ((long)kb << 7);
    const unsigned char* se = s + ex * expert_s + ((long)kb << 4);
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        cp16(ws_addr + W_AT(st, r, h, 0) + 16 * lane, we + wlo[r] + 64 * h);
        cp16(ws_addr + W_AT(st, r, h, 1) + 16 * lane, we + whi[r] + 64 * h);
      }
      cp4(ws_addr + S_AT(st, r, 0, g) + 4 * c, se + slo[r]);
      cp4(ws_addr + S_AT(st, r, 1, g) + 4 * c, se + shi[r]);
    }
  };
  // W's first stages start loading before x is staged (W does not wait on x)
#pragma unroll
  for (int i = 0; i < STAGES - 1; i++) {
    if (i < nk) issue(i, warp + i * KS);
    asm volatile("cp.async.commit_group;");
  }
#if __CUDA_ARCH__ >= 900
  // down under PDL: h is gate|up's output, complete and visible once this returns (ids, routes and W were there
  // before gate|up started); without PDL a no-op
  if (MODE >= 2) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  // x's row(s) into shared memory, every copy in flight at once (through L2: h is written by the kernel just
  // before), then each 8 values as the decode pairs them: "shift" (0, 4), (1, 5), (2, 6), (3, 7), times 2^66, where
  // the rows do not arrive so (h of a "shift" down kernel: gate|up wrote it so, X_IN_ORDER); "lut" in order
  const int x_rows = MODE == 3 ? top_k : 1;
  unsigned short* xs = (unsigned short*)(smem + KS * WARP_SMEM);
  const uint4* xg = (const uint4*)(x + (MODE == 1 ? (long)(p / top_k) * K : MODE == 2 ? (long)p * K
                                        : MODE == 3 ? (long)p * top_k * K : 0));
  const unsigned xs_addr = (unsigned)__cvta_generic_to_shared(xs);
  for (int i = threadIdx.x; i < x_rows * (K / 8); i += 32 * KS) cp16x(xs_addr + 16 * i, xg + i);
  asm volatile("cp.async.commit_group;");
  asm volatile("cp.async.wait_group 0;" ::: "memory");  // (W's first stages too: the loop's first wait wants them)
  if (SHIFT && !X_IN_ORDER)
    for (int i = threadIdx.x; i < x_rows * (K / 8); i += 32 * KS) ((uint4*)xs)[i] = x_shift_order(((uint4*)xs)[i]);
  unsigned short* xz = xs + (long)x_rows * K;  // 32 zero bytes
  if (threadIdx.x < 2) ((uint4*)xz)[threadIdx.x] = make_uint4(0, 0, 0, 0);
  if (warp == 0) tab[lane] = make_uint4(FP4_HI0, FP4_HI1, FP4_LO0, FP4_LO1);
  __syncthreads();
  // decode_fp4's tables, each lane reading its own copy back from shared memory so that they sit in its
  // registers (as constants, or as one warp-uniform copy, ptxas moved a table into a register before every
  // lookup: ~0.45 instructions a weight)
  const uint4 tv = tab[lane];
  const unsigned t[4] = {tv.x, tv.y, tv.z, tv.w};
  // B operands: x of group 2c where g == 2c (words 0, 1), of group 2c + 1 where g == 2c + 1 (words 2, 3), else
  // the zero bytes (step 0)
  const int sa = g == 2 * c, sb = g == 2 * c + 1;
  const unsigned short* xa = sa ? xs + 32 * c : xz;
  const unsigned short* xb = sb ? xs + 32 * c + 16 : xz;
  float acc[R][2];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = 0.f;

  for (int i = 0; i < nk; i++) {
    asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2));
    __syncwarp();  // the chunk's scales from the other lanes; and every lane is done with the slot refilled next
    const int nx = i + STAGES - 1;
    if (nx < nk) issue(nx % STAGES, warp + nx * KS);
    asm volatile("cp.async.commit_group;");
    const int st = i % STAGES, it = warp + i * KS;
    // x's offset of the item (MODE 3: in its choice's row, whose scale its group sums take)
    const long kx = MODE == 3 ? (long)(it / nkb) * K + ((it % nkb) << 8) : (long)it << 8;
    const float cs = MODE == 3 ? ch_s[it / nkb] : 1.f;
    if (MODE == 3 && cs == 0.f) continue;  // (warp-uniform) a choice out of range, or routed at weight 0
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const long k0 = kx + 128 * h;
      const uint4 xa0 = *(const uint4*)(xa + sa * k0), xa1 = *(const uint4*)(xa + sa * (k0 + 8));
      const uint4 xb0 = *(const uint4*)(xb + sb * k0), xb1 = *(const uint4*)(xb + sb * (k0 + 8));
#pragma unroll
      for (int r = 0; r < R; r++) {
        const uint4 wl = *(const uint4*)(ws + W_AT(st, r, h, 0) + 16 * lane);
        const uint4 wh = *(const uint4*)(ws + W_AT(st, r, h, 1) + 16 * lane);
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int q = 0; q < 4; q++) {  // word q: codes 8q .. 8q + 7, group 2c (q < 2) or 2c + 1; its x word pairs
          unsigned ga[4], gb[4];
          if (SHIFT) {
            decode_fp4_shift(word(wl, q), ga);
            decode_fp4_shift(word(wh, q), gb);
          } else {
            decode_fp4(word(wl, q), ga, t);
            decode_fp4(word(wh, q), gb, t);
          }
          const uint4 xv = q == 0 ? xa0 : q == 1 ? xa1 : q == 2 ? xb0 : xb1;
          mma(d, ga[0], gb[0], ga[1], gb[1], xv.x, xv.y);
          mma(d, ga[2], gb[2], ga[3], gb[3], xv.z, xv.w);
        }
        float f0, f1, f2, f3;
        scales2(*(const unsigned short*)(ws + S_AT(st, r, 0, g) + 8 * h + 2 * c), f0, f1);
        scales2(*(const unsigned short*)(ws + S_AT(st, r, 1, g) + 8 * h + 2 * c), f2, f3);
        if (MODE == 3) {
          acc[r][0] += (d[0] * f0 + d[1] * f1) * cs;
          acc[r][1] += (d[2] * f2 + d[3] * f3) * cs;
        } else {
          acc[r][0] += d[0] * f0 + d[1] * f1;
          acc[r][1] += d[2] * f2 + d[3] * f3;
        }
      }
    }
  }
  asm volatile("cp.async.wait_group 0;");
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int i = 0; i < 2; i++) {
      acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], 1);
      acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], 2);
    }
  if (KS > 1) {
    if (warp > 0 && c == 0) {
#pragma unroll
      for (int r = 0; r < R; r++) red[warp - 1][r][0][g] = acc[r][0], red[warp - 1][r][1][g] = acc[r][1];
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int v = 0; v < KS - 1; v++)
#pragma unroll
      for (int r = 0; r < R; r++) acc[r][0] += red[v][r][0][g], acc[r][1] += red[v][r][1][g];
  }
  if (c != 0) return;
#pragma unroll
  for (int r = 0; r < HT; r++) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int n = row0 + 16 * r + g + 8 * i;
      if (n >= N) continue;
      if (MODE == 0) {
        ((unsigned short*)y)[n] = to_bf16(acc[r][i] * (s2[n] * unit));
      } else if (MODE == 1) {
        float gt = acc[r][i] * (s2[2 * ee] * unit), up = acc[r + HT][i] * (s2[2 * ee + 1] * unit);
        gt = fminf(gt, limit);
        up = fminf(fmaxf(up, -limit), limit);
        unsigned short hv = to_bf16(e_ok ? gt / (1.f + __expf(-gt)) * up : 0.f);
        if (H_SHIFT) hv = (unsigned short)scale_x66(hv);  // (times 2^66, at x_shift_order's place of n)
        ((unsigned short*)y)[(long)p * N + (H_SHIFT ? x_shift_place(n) : n)] = hv;
      } else if (MODE == 2) {
        ((float*)y)[(long)p * N + n] = e_ok ? acc[r][i] * (s2[ee] * unit) * route[p] : 0.f;
      } else {
        ((unsigned short*)y)[(long)p * N + n] = to_bf16(acc[r][i]);
      }
    }
  }
}
"""


@dataclass(frozen=True)
class Config:
    """rows: row tiles (16 rows of W) a warp holds, per part (gate|up holds `rows` of each); splits: warps a
    block, warp w taking K chunks (256 values) w, w + splits, ...; stages: chunks a warp has in shared memory
    (stages - 1 of them loading); l2_prefetch: bytes L2 fetches with each 16-byte copy (0: no hint); decode:
    "lut" (prmt table lookups, ptx_cuda's decode_fp4) or "shift" (decode_fp4_shift: shifts and masks)."""
    rows: int = 1
    splits: int = 4
    stages: int = 2
    l2_prefetch: int = 256
    decode: str = "shift"

    def __post_init__(self):
        if self.l2_prefetch not in (0, 64, 128, 256):
            raise ValueError(f"Config.l2_prefetch: must be 0, 64, 128 or 256 (bytes), got {self.l2_prefetch!r}")
        if self.decode not in ("lut", "shift"):
            raise ValueError(f"Config.decode: must be 'lut' or 'shift', got {self.decode!r}")
        for name, lo, hi in (("rows", 1, 4), ("splits", 1, 16), ("stages", 2, 8)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ValueError(f"Config.{name}: must be an int in {lo}..{hi}, got {v!r}")

    def smem(self, parts: int, k: int, x_rows: int = 1) -> int:
        """Dynamic shared memory bytes a block uses at K = k: the warps' stages, x's rows, 32 zero bytes."""
        return self.splits * self.stages * self.rows * parts * TILE_STAGE_BYTES + 2 * k * x_rows + 32


MODES = {"dense": 0, "gate_up": 1, "down": 2, "down_sum": 3}
MAX_PAIRS = 65535  # a CUDA grid's y dimension: one (token, choice) pair each
MAX_TOP_K = 16  # "down_sum" (a token's choices summed in the down kernel) takes up to this many choices


def source(cfg: Config, mode: str, h_shift: bool = False) -> tuple[str, str]:
    """(CUDA source, kernel name) of one configuration and mode ("dense", "gate_up", "down" or "down_sum");
    h_shift (gate_up): h written in the "shift" decode's order and scale, as the down modes of that decode read it
    (`experts` pairs them so)."""
    parts = 2 if mode == "gate_up" else 1
    h_shift = h_shift and mode == "gate_up"
    name = (f"tpserve_nvfp4_m1_{mode}_r{cfg.rows}_s{cfg.splits}_st{cfg.stages}_p{cfg.l2_prefetch}_{cfg.decode}"
            + ("_hs" if h_shift else ""))
    defines = dict(R=cfg.rows * parts, PARTS=parts, KS=cfg.splits, STAGES=cfg.stages, MODE=MODES[mode], NAME=name,
                   H_SHIFT=int(h_shift), X_IN_ORDER=int(mode in ("down", "down_sum") and cfg.decode == "shift"),
                   TILE_W_BYTES=TILE_W_BYTES, TILE_STAGE_BYTES=TILE_STAGE_BYTES, MAX_TOP_K=MAX_TOP_K,
                   SHIFT=int(cfg.decode == "shift"), SEL_LO=f"{SEL_LO:#x}u", DECODE_MASK=f"{DECODE_MASK:#x}u",
                   DECODE_SHIFT=DECODE_SHIFT, **{k: f"{v:#010x}u" for k, v in fp4_tables(TABLE_LOG2).items()},
                   W_HINT=f'".L2::{cfg.l2_prefetch}B"' if cfg.l2_prefetch else '""')
    text = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + DEVICE_HELPERS + _SOURCE
    return text, name
