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
#define STAGE_BYTES TILE_STAGE_BYTES  // W [2 halves][lo|hi][32 lanes] uint4, then scales [lo|hi][8][16]
#define WARP_SMEM (STAGES * STAGE_BYTES)
#define W_AT(st, h, q) ((st) * STAGE_BYTES + (((h) * 2 + (q)) * 32) * 16)
#define S_AT(st, q, gg) ((st) * STAGE_BYTES + TILE_W_BYTES + ((q) * 8 + (gg)) * 16)

// the chunk `done` loaded: with the ring full (n = STAGES - 1 groups after it) wait for all but those; else, near
// an item's boundary or the end, for all (a switch on n compiled to an indirect branch: ncu's branch-resolving
// stalls were a tenth of the kernel's)
__device__ __forceinline__ void wait_pending(int n) {
  if (n >= STAGES - 1) asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 1) : "memory");
  else asm volatile("cp.async.wait_group 0;" ::: "memory");
}

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

// An item's place: gate|up items it < n_gu: pair p = it / (2 * nrt_g * KSPLIT), then tile, part (gate 0, up 1) and
// K slice ks, the slice fastest; down items: choice c = (it - n_gu) / (nrt_d * KSPLIT), then tile and K slice. An
// item takes K / KSPLIT of its rows' K (from chunk k0).
struct Item {
  const unsigned char* w;  // this lane's 16 bytes of row g in the item's first chunk
  const unsigned char* s;  // this lane's 4 scale bytes of row g
  long hi_w, hi_s;  // row g + 8 from row g
  int down, p, part, tile, ks, nk, k0;
  long long e;
  bool ok;
};

// w*, s*: gate|up [E, 2I, D/2], [E, 2I, D/16]; down [E, D, I/2], [E, D, I/16]. cnt (int32, zero between calls):
// [0] items taken, [1] warps done, [2, 2 + MAX_TOP_K) ready (h tiles complete) per pair, then a counter per pair
// and gate|up tile (MAX_TOP_K x I/16), then one per down tile (D/16). gub fp32 [top_k, 2, I]: gate|up sums; part
// fp32 [top_k, D]: down sums times route; h bf16 [top_k, I]; y bf16 [D]. marks (TIMELINE): per item its first
// compute's and its end's %globaltimer, and its SM << 32 | the warp's index in the grid.
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
  // x once a block (every warp's items read all of it: read from L2 by every item, its few lines were a hot spot
  // that slowed the whole layer 2x), in the "shift" decode's order, times 2^66
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
  const int nrt_g = I >> 4, nrt_d = D >> 4, n_gu = top_k * 2 * nrt_g * KSPLIT;
  const int total = n_gu + top_k * nrt_d * KSPLIT;
  int* tile_cnt = pair_cnt + MAX_TOP_K * nrt_g;
  unsigned char* ws = smem + warp * WARP_SMEM;
  const unsigned ws_addr = (unsigned)__cvta_generic_to_shared(ws);

  auto fetch = [&]() -> int {
    int v = 0;
    if (lane == 0) v = atomicAdd(cnt, 1);
    return __shfl_sync(0xffffffffu, v, 0);
  };
  auto describe = [&](int it) -> Item {
    Item d;
    d.down = it >= n_gu;
    if (!d.down) {
      const int r = it % (2 * nrt_g * KSPLIT);
      d.p = it / (2 * nrt_g * KSPLIT), d.ks = r % KSPLIT, d.part = (r / KSPLIT) & 1, d.tile = r / (2 * KSPLIT);
      d.nk = (D >> 8) / KSPLIT;
    } else {
      const int r = (it - n_gu) % (nrt_d * KSPLIT);
      d.p = (it - n_gu) / (nrt_d * KSPLIT), d.part = 0, d.tile = r / KSPLIT, d.ks = r % KSPLIT;
      d.nk = (I >> 8) / KSPLIT;
    }
    d.k0 = d.ks * d.nk;
    d.e = ids[d.p];
    d.ok = d.e >= 0 && d.e < num_experts;
    const long long ee = d.ok ? d.e : 0;
    const long K = d.down ? I : D, rows = d.down ? D : 2 * (long)I, row_bytes = K / 2, SK = K / 16;
    const long row = (long)d.part * I + 16 * d.tile + g;
    d.w = (d.down ? wd : wg) + ee * rows * row_bytes + row * row_bytes + 16 * c4;
    d.s = (d.down ? sd : sg) + ee * rows * SK + row * SK + 4 * c4;
    d.hi_w = 8 * row_bytes, d.hi_s = 8 * SK;
    return d;
  };
  auto issue = [&](int st, const Item& d, int kb) {
    const unsigned char* wb = d.w + ((long)(d.k0 + kb) << 7);
    cp16(ws_addr + W_AT(st, 0, 0) + 16 * lane, wb);
    cp16(ws_addr + W_AT(st, 0, 1) + 16 * lane, wb + d.hi_w);
    cp16(ws_addr + W_AT(st, 1, 0) + 16 * lane, wb + 64);
    cp16(ws_addr + W_AT(st, 1, 1) + 16 * lane, wb + d.hi_w + 64);
    const unsigned char* sb = d.s + ((long)(d.k0 + kb) << 4);
    cp4(ws_addr + S_AT(st, 0, g) + 4 * c4, sb);
    cp4(ws_addr + S_AT(st, 1, g) + 4 * c4, sb + d.hi_s);
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

  // the issue side: item iit at chunk ikb, inext the one after (taken at chunk FETCH_AHEAD chunks before iit's
  // end: a warp holds no item long before it can start it); the compute side: item cit at chunk ckb, csucc the
  // item issued after it (set when the issue side leaves cit: it runs at most STAGES - 1 chunks ahead, fewer than
  // an item has, so it is then in cit)
  int iit = fetch(), ikb = 0, inext = total;
  Item di = describe(iit < total ? iit : 0), dc = di;
  int cit = iit, ckb = 0, csucc = total, issued = 0, done = 0;
  const int sa = g == 2 * c4, sb = g == 2 * c4 + 1;
  float acc0 = 0.f, acc1 = 0.f;
  unsigned long long t_start = 0;
  while (true) {
    __syncwarp();  // every lane done with the slot refilled next (the chunk computed last)
    while (iit < total && issued < done + STAGES) {
      if (ikb == max(0, di.nk - STAGES - FETCH_AHEAD)) inext = fetch();
      issue(issued % STAGES, di, ikb);
      issued++;
      if (++ikb == di.nk) {
        ikb = 0;
        if (iit == cit) csucc = inext;
        iit = inext;
        inext = total;
        if (iit < total) di = describe(iit);
      }
    }
    if (issued == done) break;
    const int st = done % STAGES;
    wait_pending(issued - 1 - done);
    __syncwarp();
    if (ckb == 0) {
      dc = describe(cit);
      if (dc.down) stage_h(dc.p);
      if (TIMELINE) t_start = now_ns();
    }
    const float cs = dc.down ? (dc.ok ? route[dc.p] * s2d[dc.e] * unit : 0.f) : 1.f;
    if (cs != 0.f) {
      const unsigned short* xk = (dc.down ? hs + (long)dc.p * I : xs) + ((dc.k0 + ckb) << 8);
      const unsigned short* xa = sa ? xk + 32 * c4 : xz;
      const unsigned short* xb = sb ? xk + 32 * c4 + 16 : xz;
#pragma unroll
      for (int hh = 0; hh < 2; hh++) {
        const int k0 = 128 * hh;
        const uint4 xa0 = *(const uint4*)(xa + sa * k0), xa1 = *(const uint4*)(xa + sa * (k0 + 8));
        const uint4 xb0 = *(const uint4*)(xb + sb * k0), xb1 = *(const uint4*)(xb + sb * (k0 + 8));
        const uint4 wl = *(const uint4*)(ws + W_AT(st, hh, 0) + 16 * lane);
        const uint4 wh = *(const uint4*)(ws + W_AT(st, hh, 1) + 16 * lane);
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int q = 0; q < 4; q++) {
          unsigned ga[4], gb[4];
          decode_fp4_shift(word(wl, q), ga);
          decode_fp4_shift(word(wh, q), gb);
          const uint4 xv = q == 0 ? xa0 : q == 1 ? xa1 : q == 2 ? xb0 : xb1;
          mma(d, ga[0], gb[0], ga[1], gb[1], xv.x, xv.y);
          mma(d, ga[2], gb[2], ga[3], gb[3], xv.z, xv.w);
        }
        float f0, f1, f2, f3;
        scales2(*(const unsigned short*)(ws + S_AT(st, 0, g) + 8 * hh + 2 * c4), f0, f1);
        scales2(*(const unsigned short*)(ws + S_AT(st, 1, g) + 8 * hh + 2 * c4), f2, f3);
        acc0 += d[0] * f0 + d[1] * f1;
        acc1 += d[2] * f2 + d[3] * f3;
      }
    }
    done++;
    if (++ckb < dc.nk) continue;
    // the item's last chunk: rows g (acc0) and g + 8 (acc1) summed over the lane quad
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
    const int n0 = 16 * dc.tile + g;
    if (!dc.down) {
      const long ee = dc.ok ? dc.e : 0;
      const float sc = s2g[2 * ee + dc.part] * unit;
      const float v0 = acc0 * sc, v1 = acc1 * sc;
      float* mine = gub + (((long)dc.p * 2 + dc.part) * KSPLIT + dc.ks) * I;
      if (c4 == 0) mine[n0] = v0, mine[n0 + 8] = v1;
      __syncwarp();
      int old = 0;
      if (lane == 0) {
        __threadfence();
        old = atomicAdd(pair_cnt + dc.p * nrt_g + dc.tile, 1);
      }
      if (__shfl_sync(0xffffffffu, old, 0) == 2 * KSPLIT - 1) {  // the tile's last part: the slices summed, SwiGLU, h
        __threadfence();
        if (c4 == 0) {
          const float* gsum = gub + (long)dc.p * 2 * KSPLIT * I;
#pragma unroll
          for (int i = 0; i < 2; i++) {
            const int n = n0 + 8 * i;
            float gt = 0.f, up = 0.f;
#pragma unroll
            for (int k = 0; k < KSPLIT; k++) {
              gt += __ldcg(gsum + (long)k * I + n);
              up += __ldcg(gsum + (long)(KSPLIT + k) * I + n);
            }
            gt = fminf(gt, limit);
            up = fminf(fmaxf(up, -limit), limit);
            const unsigned short hv = to_bf16(dc.ok ? gt / (1.f + __expf(-gt)) * up : 0.f);
            h[(long)dc.p * I + ((n & ~7) | ((n & 3) << 1) | ((n >> 2) & 1))] = (unsigned short)scale_x66(hv);
          }
        }
        __syncwarp();
        if (lane == 0) {
          pair_cnt[dc.p * nrt_g + dc.tile] = 0;
          __threadfence();
          atomicAdd(ready + dc.p, 1);
        }
      }
    } else {
      float* mine = part + ((long)dc.p * KSPLIT + dc.ks) * D;
      if (c4 == 0) mine[n0] = acc0 * cs, mine[n0 + 8] = acc1 * cs;
      __syncwarp();
      int old = 0;
      if (lane == 0) {
        __threadfence();
        old = atomicAdd(tile_cnt + dc.tile, 1);
      }
      if (__shfl_sync(0xffffffffu, old, 0) == top_k * KSPLIT - 1) {  // the tile's last: the sum, in choice order
        __threadfence();
        if (c4 == 0) {
#pragma unroll
          for (int i = 0; i < 2; i++) {
            float sum = 0.f;
            for (int c = 0; c < top_k * KSPLIT; c++) sum += __ldcg(part + (long)c * D + n0 + 8 * i);
            y[n0 + 8 * i] = to_bf16(sum);
          }
        }
        if (lane == 0) tile_cnt[dc.tile] = 0;
      }
    }
    if (TIMELINE && lane == 0) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      marks[3 * cit] = (long long)t_start;
      marks[3 * cit + 1] = (long long)now_ns();
      marks[3 * cit + 2] = (long long)sm << 32 | (blockIdx.x * KS + warp);
    }
    acc0 = acc1 = 0.f;
    ckb = 0;
    cit = csucc;
    csucc = total;
  }
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
    memory holds); l2_prefetch: bytes L2 fetches with each 16-byte copy of W (0: no hint); fetch_ahead: a warp
    takes its next item when it issues the chunk stages + fetch_ahead before its item's end (or at its start)."""
    warps: int = 16
    stages: int = 3
    blocks_per_sm: int = 1
    l2_prefetch: int = 256
    fetch_ahead: int = 2
    k_splits: int = 1

    def __post_init__(self):
        if self.l2_prefetch not in (0, 64, 128, 256):
            raise ValueError(f"Config.l2_prefetch: must be 0, 64, 128 or 256 (bytes), got {self.l2_prefetch!r}")
        for name, lo, hi in (("warps", 1, 32), ("stages", 2, 8), ("blocks_per_sm", 0, 32), ("fetch_ahead", 0, 64),
                             ("k_splits", 1, MAX_K_SPLITS)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ValueError(f"Config.{name}: must be an int in {lo}..{hi}, got {v!r}")

    def smem(self, d: int, inter: int, top_k: int) -> int:
        """Dynamic shared memory bytes a block uses: the warps' stages, x, h of each choice."""
        return self.warps * self.stages * m1.TILE_STAGE_BYTES + 2 * d + 2 * top_k * inter


def source(cfg: Config, timeline: bool = False) -> tuple[str, str]:
    """(CUDA source, kernel name); timeline: the kernel records each item's start, end and SM in `marks`."""
    name = (f"tpserve_nvfp4_m1_fused_w{cfg.warps}_st{cfg.stages}_f{cfg.fetch_ahead}_k{cfg.k_splits}_p{cfg.l2_prefetch}"
            + ("_tl" if timeline else ""))
    defines = dict(KS=cfg.warps, STAGES=cfg.stages, FETCH_AHEAD=cfg.fetch_ahead, KSPLIT=cfg.k_splits, NAME=name, TIMELINE=int(timeline),
                   MAX_TOP_K=MAX_TOP_K, **m1.helper_defines("shift", cfg.l2_prefetch))
    text = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + mg.DEVICE_HELPERS + m1.DEVICE_M1 + _SOURCE
    return text, name


@functools.lru_cache(maxsize=None)
def _kernel(cfg: Config, arch: str, device: int, timeline: bool):
    from torch.cuda import _compile_kernel

    text, name = source(cfg, timeline)
    with torch.cuda.device(device):
        return _compile_kernel(text, name, compute_capability=arch)


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


class Workspace:
    """What one layer's calls share: counters (zero between calls: the kernel resets them) and the scratch rows,
    for a model's D and I at up to MAX_TOP_K choices. A call must not overlap another on the same workspace."""

    def __init__(self, d: int, inter: int, device: torch.device):
        self.d, self.inter = d, inter
        self.cnt = torch.zeros(2 + MAX_TOP_K + MAX_TOP_K * (inter // 16) + d // 16, dtype=torch.int32, device=device)
        self.gub = torch.empty(MAX_TOP_K, 2, MAX_K_SPLITS, inter, dtype=torch.float32, device=device)
        self.part = torch.empty(MAX_TOP_K, MAX_K_SPLITS, d, dtype=torch.float32, device=device)
        self.h = torch.empty(MAX_TOP_K, inter, dtype=torch.bfloat16, device=device)


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
    items = top_k * (2 * inter + d) // 16 * cfg.k_splits
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
    per_sm = cfg.blocks_per_sm or max(1, min(2048 // (32 * cfg.warps), (227 * 1024) // (smem + 1024)))
    args = [mg._aligned(gate_up, 16), gu_bscale.contiguous().view(torch.uint8), gu_scale2.float().contiguous(),
            mg._aligned(down, 16), dn_bscale.contiguous().view(torch.uint8), dn_scale2.float().contiguous(),
            mg._aligned(x, 16).view(torch.int16), ids.reshape(-1).to(torch.int64).contiguous(),
            weights.reshape(-1).float().contiguous(), ws.cnt, ws.gub, ws.part, ws.h.view(torch.int16),
            y.view(torch.int16), marks if marks is not None else ws.cnt, d, inter, top_k, num_experts,
            float("inf") if limit is None else float(limit)]
    kernel(grid=(per_sm * _sm_count(device), 1, 1), block=(32 * cfg.warps, 1, 1), shared_mem=smem, args=args)
    return y
