"""The NVFP4 MoE experts at one token in one persistent kernel (CUDA, NVRTC): gate|up with SwiGLU, then down, the
choices summed, with no handoff between two kernels.

Why: nvfp4_m1.experts runs gate|up, then down_sum. Their block timelines (bench/m1_timeline.py, BENCHMARKS.md's
twenty-eighth session) show DRAM busy at ~4.2 TB/s while every block streams, then a tail: blocks end in the order
they were issued, and as the last ones run alone their few bytes in flight cannot keep DRAM busy; down_sum then
waits for the last gate|up block and stages h. 24-30 us of the layer's ~40 carried almost no bytes.

How: every warp takes work items in turn from one counter (`atomicAdd`), so a warp that DRAM served early simply
takes more, and the items run out for all warps at about the same time. An item is one 16-row tile of W over its
whole K: a gate or an up tile of a (token, choice) pair (K = D), or a down tile of a choice (K = I). A warp streams
its items' 256-value chunks through one ring of `cp.async` stages (W's 16 rows x 128 bytes, their 16 scale bytes,
and the chunk's 256 values of x or h), the next item's first chunks loading while the current one's last compute.
Items are numbered gate|up first (pair by pair, gate and up of a tile side by side), then down (choice by choice),
so a down item's h is almost always complete when a warp reaches it.

Hand-offs, all through global memory and counters in a workspace that the kernel leaves zeroed:
- gate|up: a tile's gate and up items each write their fp32 sums; the second to finish (a per-tile counter) applies
  SwiGLU and writes those 16 values of h (in the order and scale the "shift" decode takes, nvfp4_m1's H_SHIFT),
  then counts the tile in its pair's `ready`.
- down: an item of choice c first needs `ready[c]` = I/16. A warp that finds it short computes what it has already
  loaded, and waits (spinning) only when it holds nothing else: then its own gate|up items are done, so it waits on
  others' items that are running, never on itself.
- down items write route * (h @ W^T) in fp32; the last of a tile's choices to finish sums the choices in order
  (choice 0 first) and writes y's 16 bf16 values. Sums are in one fixed order whichever warp computes what: the
  result is the same bit for bit on every run.
The last warp to finish resets the counters. Decode: nvfp4_m1's "shift" only (one row of x; scales as there).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from tpserve.kernels import launch_ex
from tpserve.kernels import mma_gemv as mg
from tpserve.kernels import nvfp4_m1 as m1

MAX_TOP_K = m1.MAX_TOP_K
MAX_K_SPLITS = 4

_SOURCE = r"""
#define STAGE_BYTES (2 * TILE_STAGE_BYTES)  // W [2 tiles][2 halves][lo|hi][32 lanes] uint4, scales [2][lo|hi][8][16]
#define WARP_SMEM (STAGES * STAGE_BYTES)
#define W_AT(st, r, h, q) ((st) * STAGE_BYTES + ((((r) * 2 + (h)) * 2 + (q)) * 32) * 16)
#define S_AT(st, r, q, gg) ((st) * STAGE_BYTES + 2 * TILE_W_BYTES + (((r) * 2 + (q)) * 8 + (gg)) * 16)

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// one chunk of NR row tiles from ring slot st of a warp's stages ws, against x's (or h's) 256 values at xk
template <int NR>
__device__ __forceinline__ void compute_chunk(const unsigned char* ws, const unsigned short* xk,
                                              const unsigned short* xz, int lane, int st, float (&acc)[2][2]) {
  const int g = lane >> 2, c4 = lane & 3, sa = g == 2 * c4, sb = g == 2 * c4 + 1;
  const unsigned short* xa = sa ? xk + 32 * c4 : xz;
  const unsigned short* xb = sb ? xk + 32 * c4 + 16 : xz;
#pragma unroll
  for (int hh = 0; hh < 2; hh++) {
    const int k0 = 128 * hh;
    const uint4 xa0 = *(const uint4*)(xa + sa * k0), xa1 = *(const uint4*)(xa + sa * (k0 + 8));
    const uint4 xb0 = *(const uint4*)(xb + sb * k0), xb1 = *(const uint4*)(xb + sb * (k0 + 8));
#pragma unroll
    for (int r = 0; r < NR; r++) {
      const uint4 wl = *(const uint4*)(ws + W_AT(st, r, hh, 0) + 16 * lane);
      const uint4 wh = *(const uint4*)(ws + W_AT(st, r, hh, 1) + 16 * lane);
      float dd[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int q = 0; q < 4; q++) {
        unsigned ga[4], gb[4];
        decode_fp4_shift(word(wl, q), ga);
        decode_fp4_shift(word(wh, q), gb);
        const uint4 xv = q == 0 ? xa0 : q == 1 ? xa1 : q == 2 ? xb0 : xb1;
        mma(dd, ga[0], gb[0], ga[1], gb[1], xv.x, xv.y);
        mma(dd, ga[2], gb[2], ga[3], gb[3], xv.z, xv.w);
      }
      float f0, f1, f2, f3;
      scales2(*(const unsigned short*)(ws + S_AT(st, r, 0, g) + 8 * hh + 2 * c4), f0, f1);
      scales2(*(const unsigned short*)(ws + S_AT(st, r, 1, g) + 8 * hh + 2 * c4), f2, f3);
      acc[r][0] += dd[0] * f0 + dd[1] * f1;
      acc[r][1] += dd[2] * f2 + dd[3] * f3;
    }
  }
}

// An item's place. gate|up items it < n_gu: pair p = it / (nrt_g * KSPLIT), then the row tile tg and the K slice ks
// (fastest); the item holds the gate tile (rows 16 tg + [0, 16)) and the up tile (I rows on): two row tiles, as
// nvfp4_m1's gate|up warps, each lane holding both halves of its SwiGLU outputs. down items: choice c = (it - n_gu)
// / (ngd * KSPLIT), then the group tg of DT row tiles (rows 16 DT tg + [0, 16 DT)) and ks. An item takes K / KSPLIT
// of its rows' K (chunks k0 ..). Two row tiles a warp, not one: a tile's decode has too little independent work to
// hide its own latencies (Nsight Compute: one-tile items issued ~0.4 instructions a cycle a scheduler).
struct Item {
  const unsigned char* w;  // this lane's 16 bytes of row g of the first tile in chunk 0
  const unsigned char* s;  // this lane's 4 scale bytes of that row
  int down, p, tg, ks, nk, k0;
  long long e;
  bool ok;
};

// w*, s*: gate|up [E, 2I, D/2], [E, 2I, D/16]; down [E, D, I/2], [E, D, I/16]. cnt (int32, zero between calls):
// [0] items taken, [1] warps done, [2, 2 + MAX_TOP_K) ready (h tiles complete) per pair, then a counter per pair
// and gate|up tile (MAX_TOP_K x I/16), then one per down tile group (D/16/DT). gub fp32 [top_k, 2, KSPLIT, I]:
// gate|up slice sums; part fp32 [top_k, KSPLIT, D]: down slice sums times route; h bf16 [top_k, I]; y bf16 [D].
// marks (TIMELINE): per item its first compute's and its end's %globaltimer, and its SM << 32 | the warp's index
// in the grid.
extern "C" __global__ void __launch_bounds__(32 * KS) NAME(
    const unsigned char* __restrict__ wg, const unsigned char* __restrict__ sg, const float* __restrict__ s2g,
    const unsigned char* __restrict__ wd, const unsigned char* __restrict__ sd, const float* __restrict__ s2d,
    const unsigned short* __restrict__ x, const long long* __restrict__ ids, const float* __restrict__ route,
    int* __restrict__ cnt, float* __restrict__ gub, float* __restrict__ part, unsigned short* __restrict__ h,
    unsigned short* __restrict__ y, long long* __restrict__ marks, int D, int I, int top_k, int num_experts,
    double limit_d) {
  const float limit = (float)limit_d;
  const float unit = 1152921504606846976.0f;  // 2^60 (nvfp4_m1.TABLE_LOG2)
  // dynamic shared memory: the warps' stages, then x (D values), then h of each choice (I values each), bf16
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(16) unsigned short xz[16];  // zeros: the B operands of lanes outside their group
  __shared__ int h_state[MAX_TOP_K];  // h of a choice in this block: 0 not asked for, 1 being copied, 2 here
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c4 = lane & 3;
  unsigned short* xs = (unsigned short*)(smem + KS * WARP_SMEM);
  unsigned short* hs = xs + D;
  // x once a block (every warp's items read all of it: read from L2 by every item, its few lines were a hot spot),
  // in the "shift" decode's order, times 2^66
  {
    const unsigned xs_addr = (unsigned)__cvta_generic_to_shared(xs);
    for (int i = threadIdx.x; i < D / 8; i += 32 * KS) cp16x(xs_addr + 16 * i, (const uint4*)x + i);
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    for (int i = threadIdx.x; i < D / 8; i += 32 * KS) ((uint4*)xs)[i] = x_shift_order(((uint4*)xs)[i]);
  }
  if (threadIdx.x < 16) xz[threadIdx.x] = 0;
  if (threadIdx.x < MAX_TOP_K) h_state[threadIdx.x] = 0;
  __syncthreads();
  int* ready = cnt + 2;
  int* pair_cnt = ready + MAX_TOP_K;
  const int nrt_g = I >> 4, ngd = (D >> 4) / DT, n_gu = top_k * nrt_g * KSPLIT, total = n_gu + top_k * ngd * KSPLIT;
  int* tile_cnt = pair_cnt + MAX_TOP_K * nrt_g;
  unsigned char* ws = smem + warp * WARP_SMEM;
  const unsigned ws_addr = (unsigned)__cvta_generic_to_shared(ws);

  auto describe = [&](int it) -> Item {
    Item d;
    d.down = it >= n_gu;
    const int j = d.down ? it - n_gu : it, per = (d.down ? ngd : nrt_g) * KSPLIT, r = j % per;
    d.p = j / per, d.tg = r / KSPLIT, d.ks = r % KSPLIT;
    d.nk = ((d.down ? I : D) >> 8) / KSPLIT, d.k0 = d.ks * d.nk;
    d.e = ids[d.p];
    d.ok = d.e >= 0 && d.e < num_experts;
    const long long ee = d.ok ? d.e : 0;
    const long K = d.down ? I : D, rows = d.down ? D : 2 * (long)I, row_bytes = K / 2, SK = K / 16;
    const long row = (d.down ? 16L * DT * d.tg : 16L * d.tg) + g;
    d.w = (d.down ? wd : wg) + ee * rows * row_bytes + row * row_bytes + 16 * c4;
    d.s = (d.down ? sd : sg) + ee * rows * SK + row * SK + 4 * c4;
    return d;
  };
  auto issue = [&](int st, const Item& d, int kb) {
    // row g + 8 from row g: 8 rows of K / 2 bytes (K / 16 scales); the second tile from the first: I rows (gate to
    // up) or 16 (down)
    const long K = d.down ? I : D, hi_w = 4 * K, hi_s = K / 2, rstep = d.down ? 16 : I;
#pragma unroll
    for (int r = 0; r < 2; r++) {
      if (r == 0 || !d.down || DT == 2) {
        const unsigned char* wb = d.w + r * rstep * (K / 2) + ((long)(d.k0 + kb) << 7);
        cp16(ws_addr + W_AT(st, r, 0, 0) + 16 * lane, wb);
        cp16(ws_addr + W_AT(st, r, 0, 1) + 16 * lane, wb + hi_w);
        cp16(ws_addr + W_AT(st, r, 1, 0) + 16 * lane, wb + 64);
        cp16(ws_addr + W_AT(st, r, 1, 1) + 16 * lane, wb + hi_w + 64);
        const unsigned char* sb = d.s + r * rstep * (K / 16) + ((long)(d.k0 + kb) << 4);
        cp4(ws_addr + S_AT(st, r, 0, g) + 4 * c4, sb);
        cp4(ws_addr + S_AT(st, r, 1, g) + 4 * c4, sb + hi_s);
      }
    }
    asm volatile("cp.async.commit_group;");
  };
  // h of choice c in this block's shared memory: the first warp to want it waits for gate|up's tiles of c (it has
  // none of its own left: a warp computes its items in order, gate|up first), copies it, and marks it here
  auto stage_h = [&](int c) {
    int st = 0;
    if (lane == 0) st = atomicCAS(h_state + c, 0, 1);
    st = __shfl_sync(0xffffffffu, st, 0);
    if (st == 0) {
      if (lane == 0)
        while (ld_acquire(ready + c) < nrt_g) __nanosleep(128);
      __syncwarp();
      const uint4* src = (const uint4*)(h + (long)c * I);
      uint4* dst = (uint4*)(hs + (long)c * I);
#pragma unroll 8
      for (int i = lane; i < I / 8; i += 32) dst[i] = __ldcg(src + i);
      __syncwarp();
      __threadfence_block();
      if (lane == 0) atomicExch(h_state + c, 2);
    } else {
      if (lane == 0)
        while (atomicAdd(h_state + c, 0) != 2) __nanosleep(32);
      __syncwarp();
    }
  };
  auto swiglu_h = [&](int p, int n, float gt, float up, bool ok) {  // h[p][n] in the "shift" order and scale
    gt = fminf(gt, limit);
    up = fminf(fmaxf(up, -limit), limit);
    const unsigned short hv = to_bf16(ok ? gt / (1.f + __expf(-gt)) * up : 0.f);
    h[(long)p * I + ((n & ~7) | ((n & 3) << 1) | ((n >> 2) & 1))] = (unsigned short)scale_x66(hv);
  };
  // the last of `need` arrivals at *counter: lane 0 counts with an acq_rel atomic once the warp's writes are done
  // (the warp barrier orders the other lanes' writes before it), the last reads the others' writes after it
  auto last_of = [&](int* counter, int need) -> bool {
    __syncwarp();
    int old = 0;
    if (lane == 0) asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
    const bool last = __shfl_sync(0xffffffffu, old, 0) == need - 1;
    return last;
  };
  auto release_add = [&](int* counter) {  // lane 0, after a warp barrier: the warp's writes before the count
    __syncwarp();
    if (lane == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" :: "l"(counter) : "memory");
  };
  // Items: a warp's first is its rank (warp-major over the grid: warp 0 of every block first, which the SMs'
  // schedulers favour, so the first pairs' gate|up tiles finish first and their down items can start while later
  // pairs' still run); later ones come from the counter (after the ranks). The next item's number is asked for as
  // an item starts (the atomic's answer used only at its end) and its first chunks load during the current one's last.
  const int warps_all = gridDim.x * KS;
  int cur_id = warp * gridDim.x + blockIdx.x, nxt_id = total, pending = 0;
  if (cur_id < total && lane == 0) pending = atomicAdd(cnt, 1);
  if (cur_id < total) nxt_id = min(total, warps_all + __shfl_sync(0xffffffffu, pending, 0));
  Item cur = describe(cur_id < total ? cur_id : 0), nxt = describe(nxt_id < total ? nxt_id : 0);
  int q = 0;  // chunks computed so far (ring slot q % STAGES)
  if (cur_id < total)
#pragma unroll
    for (int i = 0; i < STAGES - 1; i++) issue(i % STAGES, cur, i);  // (STAGES - 1 <= an item's chunks)
  while (cur_id < total) {
    if (nxt_id < total && lane == 0) pending = atomicAdd(cnt, 1);  // the item after nxt
    if (cur.down) stage_h(cur.p);
    const unsigned long long t_start = TIMELINE ? now_ns() : 0;
    const bool skip = cur.down && !(cur.ok && route[cur.p] != 0.f);  // (warp-uniform) nothing to add
    float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    for (int kb = 0; kb < cur.nk; kb++, q++) {
      asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2) : "memory");
      __syncwarp();  // every lane's copies of chunk q landed; every lane done with the slot refilled next
      const int j = kb + STAGES - 1;
      if (j < cur.nk) issue((q + STAGES - 1) % STAGES, cur, j);
      else if (nxt_id < total) issue((q + STAGES - 1) % STAGES, nxt, j - cur.nk);
      else asm volatile("cp.async.commit_group;");
      if (skip) continue;
      const unsigned short* xk = (cur.down ? hs + (long)cur.p * I : xs) + ((cur.k0 + kb) << 8);
      if (cur.down && DT == 1) compute_chunk<1>(ws, xk, xz, lane, q % STAGES, acc);
      else compute_chunk<2>(ws, xk, xz, lane, q % STAGES, acc);
    }
    // the item's last chunk: rows g ([r][0]) and g + 8 ([r][1]) of each tile, summed over the lane quad
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int i = 0; i < 2; i++) {
        acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], 1);
        acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], 2);
      }
    const long ee = cur.ok ? cur.e : 0;
    if (!cur.down) {
      const int n0 = 16 * cur.tg + g;
      const float sg0 = s2g[2 * ee] * unit, sg1 = s2g[2 * ee + 1] * unit;
      bool tile_done = true;
      if (KSPLIT == 1) {
        if (c4 == 0)
#pragma unroll
          for (int i = 0; i < 2; i++) swiglu_h(cur.p, n0 + 8 * i, acc[0][i] * sg0, acc[1][i] * sg1, cur.ok);
      } else {  // the slices' sums; the tile's last slice adds them in slice order, then SwiGLU
        float* gsum = gub + (long)cur.p * 2 * KSPLIT * I;
        if (c4 == 0)
#pragma unroll
          for (int i = 0; i < 2; i++) {
            gsum[(long)cur.ks * I + n0 + 8 * i] = acc[0][i] * sg0;
            gsum[(long)(KSPLIT + cur.ks) * I + n0 + 8 * i] = acc[1][i] * sg1;
          }
        int* pc = pair_cnt + cur.p * nrt_g + cur.tg;
        tile_done = last_of(pc, KSPLIT);
        if (tile_done) {
          if (c4 == 0)
#pragma unroll
            for (int i = 0; i < 2; i++) {
              float gt = 0.f, up = 0.f;
#pragma unroll
              for (int k = 0; k < KSPLIT; k++) {
                gt += __ldcg(gsum + (long)k * I + n0 + 8 * i);
                up += __ldcg(gsum + (long)(KSPLIT + k) * I + n0 + 8 * i);
              }
              swiglu_h(cur.p, n0 + 8 * i, gt, up, cur.ok);
            }
          if (lane == 0) *pc = 0;
        }
      }
      if (tile_done) release_add(ready + cur.p);  // the tile's 16 values of h are written: count them
    } else {
      const float cs = skip ? 0.f : route[cur.p] * s2d[ee] * unit;
      float* mine = part + ((long)cur.p * KSPLIT + cur.ks) * D;
      const int n0 = 16 * DT * cur.tg + g;
      if (c4 == 0)
#pragma unroll
        for (int r = 0; r < DT; r++) mine[n0 + 16 * r] = acc[r][0] * cs, mine[n0 + 16 * r + 8] = acc[r][1] * cs;
      if (last_of(tile_cnt + cur.tg, top_k * KSPLIT)) {  // the group's last: the sum, choice by choice, slice by slice
        if (c4 == 0)
#pragma unroll
          for (int i = 0; i < 2 * DT; i++) {
            const int n = n0 + 8 * i;
            float sum = 0.f;
            for (int c = 0; c < top_k * KSPLIT; c++) sum += __ldcg(part + (long)c * D + n);
            y[n] = to_bf16(sum);
          }
        if (lane == 0) tile_cnt[cur.tg] = 0;
      }
    }
    if (TIMELINE && lane == 0) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      marks[3 * cur_id] = (long long)t_start;
      marks[3 * cur_id + 1] = (long long)now_ns();
      marks[3 * cur_id + 2] = (long long)sm << 32 | (blockIdx.x * KS + warp);
    }
    cur_id = nxt_id, cur = nxt;
    if (cur_id < total) {
      nxt_id = min(total, warps_all + __shfl_sync(0xffffffffu, pending, 0));
      nxt = describe(nxt_id < total ? nxt_id : 0);
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  // the last warp out resets what the next call counts from (every other warp has taken its last item)
  if (lane == 0 && atomicAdd(cnt + 1, 1) == (int)(gridDim.x * KS) - 1) {
    for (int c = 0; c < MAX_TOP_K; c++) ready[c] = 0;
    cnt[0] = 0;
    cnt[1] = 0;
    __threadfence();
  }
}
"""


@dataclass(frozen=True)
class Config:
    """warps: warps a block; stages: chunks a warp holds in shared memory (stages - 1 loading while one computes;
    at most the chunks of the smaller K over 256); blocks_per_sm: blocks launched per SM (0: as many as the shared
    memory holds, at most what the SMs hold at once); l2_prefetch: bytes L2 fetches with each 16-byte copy of W (0:
    no hint); k_splits: slices of K an item takes (a tile's slices summed by the last one, in order); down_tiles: row tiles a
    down item holds (1 or 2; gate|up items hold two, gate and up)."""
    warps: int = 16
    stages: int = 2
    blocks_per_sm: int = 1
    l2_prefetch: int = 256
    k_splits: int = 2
    down_tiles: int = 1

    def __post_init__(self):
        if self.l2_prefetch not in (0, 64, 128, 256):
            raise ValueError(f"Config.l2_prefetch: must be 0, 64, 128 or 256 (bytes), got {self.l2_prefetch!r}")
        for name, lo, hi in (("warps", 1, 32), ("stages", 2, 8), ("blocks_per_sm", 0, 32),
                             ("k_splits", 1, MAX_K_SPLITS), ("down_tiles", 1, 2)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ValueError(f"Config.{name}: must be an int in {lo}..{hi}, got {v!r}")

    def smem(self, d: int, inter: int, top_k: int) -> int:
        """Dynamic shared memory bytes a block uses: the warps' stages, x, h of each choice."""
        return self.warps * self.stages * 2 * m1.TILE_STAGE_BYTES + 2 * d + 2 * top_k * inter


def source(cfg: Config, timeline: bool = False) -> tuple[str, str]:
    """(CUDA source, kernel name); timeline: the kernel records each item's start, end and SM in `marks`."""
    name = (f"tpserve_nvfp4_m1_fused_w{cfg.warps}_st{cfg.stages}_k{cfg.k_splits}_"
            f"t{cfg.down_tiles}_p{cfg.l2_prefetch}" + ("_tl" if timeline else ""))
    defines = dict(KS=cfg.warps, STAGES=cfg.stages, KSPLIT=cfg.k_splits,
                   DT=cfg.down_tiles, NAME=name, TIMELINE=int(timeline), MAX_TOP_K=MAX_TOP_K, **m1.helper_defines("shift", cfg.l2_prefetch))
    text = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + mg.DEVICE_HELPERS + m1.DEVICE_M1 + _SOURCE
    return text, name


@functools.lru_cache(maxsize=None)
def _kernel(cfg: Config, arch: str, device: int, timeline: bool):
    from torch.cuda import _compile_kernel

    text, name = source(cfg, timeline)
    with torch.cuda.device(device):
        return _compile_kernel(text, name, compute_capability=arch)


class Workspace:
    """What one layer's calls share: counters (zero between calls: the kernel resets them) and the scratch rows,
    for a model's D and I at up to MAX_TOP_K choices. A call must not overlap another on the same workspace."""

    def __init__(self, d: int, inter: int, device: torch.device):
        self.d, self.inter = d, inter
        self.cnt = torch.zeros(2 + MAX_TOP_K + MAX_TOP_K * (inter // 16) + d // 16, dtype=torch.int32, device=device)
        self.gub = torch.empty(MAX_TOP_K, 2, MAX_K_SPLITS, inter, dtype=torch.float32, device=device)
        self.part = torch.empty(MAX_TOP_K, MAX_K_SPLITS, d, dtype=torch.float32, device=device)
        self.h = torch.empty(MAX_TOP_K, inter, dtype=torch.bfloat16, device=device)


def items_of(cfg: Config, d: int, inter: int, top_k: int) -> int:
    """Work items of a call (a timeline's rows): gate|up, then down."""
    return top_k * cfg.k_splits * (inter // 16 + d // 16 // cfg.down_tiles)


def fits(x: torch.Tensor, ids: torch.Tensor, inter: int, cfg: Config | None = None) -> bool:
    """The shapes this kernel takes under cfg: one bf16 token, at most MAX_TOP_K choices, D and I multiples of
    256 x k_splits with at least `stages` chunks of 256 in each K slice."""
    cfg = cfg or Config()
    unit = 256 * cfg.k_splits
    return (x.dim() == 2 and x.shape[0] == 1 and x.dtype == torch.bfloat16 and ids.shape[-1] <= MAX_TOP_K
            and min(x.shape[1], inter) >= unit * cfg.stages and x.shape[1] % unit == 0 and inter % unit == 0)


def experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
            gu_bscale: torch.Tensor, gu_scale2: torch.Tensor, down: torch.Tensor, dn_bscale: torch.Tensor,
            dn_scale2: torch.Tensor, limit: float | None, workspace: Workspace | None = None,
            cfg: Config | None = None, marks: torch.Tensor | None = None) -> torch.Tensor:
    """nvfp4_m1.experts' arguments and result at one token (x [1, D] bf16, weights / ids [1, top_k]; layouts as
    there) in one kernel. workspace: reused across calls (None: a new one, zeroed: a memset more); marks: int64
    [items, 3], the timeline (see the source). -> [1, D] bf16."""
    cfg = cfg or Config()
    t, top_k = ids.shape
    num_experts, two_i, half_d = gate_up.shape
    inter, d = two_i // 2, 2 * half_d
    if not (x.is_cuda and fits(x, ids, inter, cfg)) or x.shape[1] != d or tuple(weights.shape) != (t, top_k):
        raise ValueError(f"x, ids, weights: must be one bf16 CUDA token [1, {d}] with ids / weights [1, <= "
                         f"{MAX_TOP_K}] and D, I multiples of {256 * cfg.k_splits}, at least {cfg.stages} x that; "
                         f"got x "
                         f"{tuple(x.shape)} {x.dtype} on {x.device}, ids {tuple(ids.shape)}, weights "
                         f"{tuple(weights.shape)}, I = {inter}")
    if tuple(down.shape) != (num_experts, d, inter // 2) or tuple(gu_scale2.shape) != (num_experts, 2) or \
            tuple(dn_scale2.shape) != (num_experts, 1):
        raise ValueError(f"down / scale2: expected [{num_experts}, {d}, {inter // 2}], [{num_experts}, 2], "
                         f"[{num_experts}, 1]; got {tuple(down.shape)}, {tuple(gu_scale2.shape)}, "
                         f"{tuple(dn_scale2.shape)}")
    ws = workspace or Workspace(d, inter, x.device)
    if (ws.d, ws.inter) != (d, inter) or ws.cnt.device != x.device:
        raise ValueError(f"workspace: built for D {ws.d}, I {ws.inter} on {ws.cnt.device}, called with D {d}, I "
                         f"{inter} on {x.device}")
    items = items_of(cfg, d, inter, top_k)
    if marks is not None and (marks.dtype != torch.int64 or marks.numel() < 3 * items or not marks.is_cuda):
        raise ValueError(f"marks: must be CUDA int64 with at least {3 * items} values, got {marks.dtype} "
                         f"{marks.numel()}")
    y = torch.empty(1, d, dtype=torch.bfloat16, device=x.device)
    device = x.device.index
    major, minor = torch.cuda.get_device_capability(device)
    kernel = _kernel(cfg, f"{major}{minor}", device, marks is not None)
    smem = cfg.smem(d, inter, top_k)
    if smem > 227 * 1024:
        raise ValueError(f"cfg: {cfg} needs {smem} bytes of shared memory a block at D {d}, I {inter}, top_k {top_k}; "
                         "an SM holds 227 KiB (fewer warps or stages)")
    launch_ex.reserve_smem(kernel, smem)
    # every block must be on an SM at once: a warp waiting for h waits on gate|up items that other warps hold
    # from the start (their first items are their ranks), which a block not yet started would never run
    fit = launch_ex.max_active_blocks(kernel, 32 * cfg.warps, smem)
    if fit < 1 or cfg.blocks_per_sm > fit:
        raise ValueError(f"cfg: {cfg} asks for {cfg.blocks_per_sm} blocks an SM, the SM holds {fit} of them")
    per_sm = cfg.blocks_per_sm or fit
    args = [mg._aligned(gate_up, 16), gu_bscale.contiguous().view(torch.uint8), gu_scale2.float().contiguous(),
            mg._aligned(down, 16), dn_bscale.contiguous().view(torch.uint8), dn_scale2.float().contiguous(),
            mg._aligned(x, 16).view(torch.int16), ids.reshape(-1).to(torch.int64).contiguous(),
            weights.reshape(-1).float().contiguous(), ws.cnt, ws.gub, ws.part, ws.h.view(torch.int16),
            y.view(torch.int16), marks if marks is not None else ws.cnt, d, inter, top_k, num_experts,
            float("inf") if limit is None else float(limit)]
    kernel(grid=(per_sm * launch_ex.sms(device), 1, 1), block=(32 * cfg.warps, 1, 1), shared_mem=smem, args=args)
    return y
