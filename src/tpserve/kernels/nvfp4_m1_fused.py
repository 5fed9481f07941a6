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

// Items, taken by whole blocks: gate|up items it < n_gu: pair p = it / (I/16), row tile t = it % (I/16): the gate
// tile (rows 16 t ..) and the up tile (I rows on), over all of K = D: task j is chunk j (256 values) of both tiles.
// down items: choice c = (it - n_gu) / ngd, group tg of DG tile pairs (rows 32 DG tg ..): task j is chunk j % (I/256)
// of tile pair j / (I/256). A block's warps take an item's tasks in turn (warp w: w, w + KS, ...), so a block reads
// whole rows at once, and an item is done in about a task's time: items end in about the order they were taken,
// so the first pairs' h is complete while later pairs' gate|up still stream, and down starts without a gap.
struct Item {
  const unsigned char* w;  // this lane's 16 bytes of row g of the first tile in chunk 0
  const unsigned char* s;  // this lane's 4 scale bytes of that row
  int down, p, t, tasks;
  long long e;
  bool ok;
};

// w*, s*: gate|up [E, 2I, D/2], [E, 2I, D/16]; down [E, D, I/2], [E, D, I/16]. cnt (int32, zero between calls):
// [0] items taken, [1] warps done, [2, 2 + MAX_TOP_K) ready (h tiles complete) per pair, then one per down group
// (D / (32 DG)). part fp32 [top_k, D]: down sums times route; h bf16 [top_k, I]; y bf16 [D]. marks (TIMELINE): per
// item the start of its first task, its end, and its block's SM << 32 | block.
extern "C" __global__ void __launch_bounds__(32 * KS) NAME(
    const unsigned char* __restrict__ wg, const unsigned char* __restrict__ sg, const float* __restrict__ s2g,
    const unsigned char* __restrict__ wd, const unsigned char* __restrict__ sd, const float* __restrict__ s2d,
    const unsigned short* __restrict__ x, const long long* __restrict__ ids, const float* __restrict__ route,
    int* __restrict__ cnt, float* __restrict__ part, unsigned short* __restrict__ h,
    unsigned short* __restrict__ y, long long* __restrict__ marks, int D, int I, int top_k, int num_experts,
    double limit_d) {
  const float limit = (float)limit_d;
  const float unit = 1152921504606846976.0f;  // 2^60 (nvfp4_m1.TABLE_LOG2)
  const int nkd = I >> 8, tasks_g = D >> 8, tasks_d = DG * nkd, tmax = max(tasks_g, tasks_d);
  // dynamic shared memory: the warps' stages, x (D bf16), h of each choice (I bf16 each), then the item slots'
  // task sums (Q x tmax x 32 fp32)
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(16) unsigned short xz[16];  // zeros: the B operands of lanes outside their group
  __shared__ int h_state[MAX_TOP_K];  // h of a choice in this block: the warps that have copied their share
  // the block's items by position: q_id[pos % IDQ] the item at position q_seq[..] (taken from the counter by warp
  // 0's lane 0, FA positions ahead of its own, in order); the task sums of position pos in slot pos % Q, free_seq
  // the position whose sums last left it, arrived the tasks summed into it so far
  __shared__ int q_id[IDQ], q_seq[IDQ], free_seq[Q], arrived[Q];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c4 = lane & 3;
  unsigned short* xs = (unsigned short*)(smem + KS * WARP_SMEM);
  unsigned short* hs = xs + D;
  float* red = (float*)(hs + (long)top_k * I);
  {  // x once a block, in the "shift" decode's order, times 2^66
    const unsigned xs_addr = (unsigned)__cvta_generic_to_shared(xs);
    for (int i = threadIdx.x; i < D / 8; i += 32 * KS) cp16x(xs_addr + 16 * i, (const uint4*)x + i);
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    for (int i = threadIdx.x; i < D / 8; i += 32 * KS) ((uint4*)xs)[i] = x_shift_order(((uint4*)xs)[i]);
  }
  if (threadIdx.x < 16) xz[threadIdx.x] = 0;
  if (threadIdx.x < MAX_TOP_K) h_state[threadIdx.x] = 0;
  if (threadIdx.x < Q) free_seq[threadIdx.x] = threadIdx.x - Q, arrived[threadIdx.x] = 0;
  if (threadIdx.x < IDQ) q_seq[threadIdx.x] = -1;
  if (threadIdx.x == 0) {  // the first FA positions' items at once
    const int base = atomicAdd(cnt, FA);
    for (int i = 0; i < FA; i++) q_id[i] = base + i, q_seq[i] = i;
  }
  __syncthreads();
  int* ready = cnt + 2;
  int* group_cnt = ready + MAX_TOP_K;
  const int nrt_g = I >> 4, ngd = D / (32 * DG), n_gu = top_k * nrt_g, total = n_gu + top_k * ngd;
  unsigned char* ws = smem + warp * WARP_SMEM;
  const unsigned ws_addr = (unsigned)__cvta_generic_to_shared(ws);
  volatile int* vq_seq = q_seq;
  volatile int* vfree = free_seq;
  volatile int* vq_id = q_id;

  // warp 0, lane 0: publish the item asked for last time (its answer has long come back), then ask for the next
  // position's while it is at most FA ahead of `my_pos` and its entry is free (that position's item IDQ back has
  // been summed, so every warp has read it)
  int f_pos = FA, f_pending = -1, f_val = 0;
  auto take_ahead = [&](int my_pos) {
    if (f_pending >= 0) {
      vq_id[f_pending % IDQ] = f_val;
      __threadfence_block();
      vq_seq[f_pending % IDQ] = f_pending;
      f_pending = -1;
    }
    if (f_pos <= my_pos + FA && vfree[(f_pos - IDQ + Q * IDQ) % Q] >= f_pos - IDQ) {
      f_val = atomicAdd(cnt, 1);
      f_pending = f_pos++;
    }
  };
  // the item at the block's position pos: warp 0 takes them ahead, and takes the next one while it waits
  auto item_at = [&](int pos) -> int {
    int id = 0;
    if (lane == 0) {
      if (warp == 0) take_ahead(pos);
      while (vq_seq[pos % IDQ] != pos) {
        if (warp == 0) take_ahead(pos);
        else __nanosleep(128);
      }
      __threadfence_block();
      id = vq_id[pos % IDQ];
    }
    return min(total, __shfl_sync(0xffffffffu, id, 0));
  };
  auto describe = [&](int it) -> Item {
    Item d;
    d.down = it >= n_gu;
    const int j = d.down ? it - n_gu : it, per = d.down ? ngd : nrt_g;
    d.p = j / per, d.t = j % per, d.tasks = d.down ? tasks_d : tasks_g;
    d.e = ids[d.p];
    d.ok = d.e >= 0 && d.e < num_experts;
    const long long ee = d.ok ? d.e : 0;
    const long K = d.down ? I : D, rows = d.down ? D : 2 * (long)I, row_bytes = K / 2, SK = K / 16;
    const long row = (d.down ? 32L * DG * d.t : 16L * d.t) + g;
    d.w = (d.down ? wd : wg) + ee * rows * row_bytes + row * row_bytes + 16 * c4;
    d.s = (d.down ? sd : sg) + ee * rows * SK + row * SK + 4 * c4;
    return d;
  };
  // task j of item d into ring slot st: two row tiles (gate and up; or a down tile pair), one chunk
  auto issue = [&](int st, const Item& d, int j) {
    const long K = d.down ? I : D, hi_w = 4 * K, hi_s = K / 2, rstep = d.down ? 16 : I;
    const int kb = d.down ? j % nkd : j;
    const long row0 = d.down ? 32L * (j / nkd) : 0;
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const long rr = row0 + r * rstep;
      const unsigned char* wb = d.w + rr * (K / 2) + ((long)kb << 7);
      cp16(ws_addr + W_AT(st, r, 0, 0) + 16 * lane, wb);
      cp16(ws_addr + W_AT(st, r, 0, 1) + 16 * lane, wb + hi_w);
      cp16(ws_addr + W_AT(st, r, 1, 0) + 16 * lane, wb + 64);
      cp16(ws_addr + W_AT(st, r, 1, 1) + 16 * lane, wb + hi_w + 64);
      const unsigned char* sb = d.s + rr * (K / 16) + ((long)kb << 4);
      cp4(ws_addr + S_AT(st, r, 0, g) + 4 * c4, sb);
      cp4(ws_addr + S_AT(st, r, 1, g) + 4 * c4, sb + hi_s);
    }
    asm volatile("cp.async.commit_group;");
  };
  // h of choice c in this block's shared memory: every warp copies its share once gate|up's tiles of c are all
  // in (every item before this down item in the block is done by this warp, and gate|up items come before down
  // ones), counts itself in h_state[c], and goes on once all KS have (one warp copying it alone held the block's
  // other warps ~a load's latency, spinning: Nsight Compute counted 40% more instructions than nvfp4_m1's kernels)
  auto stage_h = [&](int c) {
    if (lane == 0)
      while (ld_acquire(ready + c) < nrt_g) __nanosleep(256);
    __syncwarp();
    const uint4* src = (const uint4*)(h + (long)c * I);
    uint4* dst = (uint4*)(hs + (long)c * I);
    for (int i = warp * 32 + lane; i < I / 8; i += 32 * KS) dst[i] = __ldcg(src + i);
    __syncwarp();
    if (lane == 0) {
      __threadfence_block();
      atomicAdd(h_state + c, 1);
      while (atomicAdd(h_state + c, 0) < KS) __nanosleep(128);
    }
    __syncwarp();
  };

  // the issue side's task (ipos, ij) and the compute side's (cpos, cj), a task apart by STAGES - 1
  int ipos = 0, ij = warp, iid = item_at(0);
  Item di = describe(iid < total ? iid : 0);
  int cpos = 0, cj = warp, cid = iid;
  Item dc = di;
  auto next_issue = [&]() {
    ij += KS;
    if (ij >= di.tasks) {
      ij = warp, iid = item_at(++ipos);
      if (iid < total) di = describe(iid);
    }
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; i++) {
    if (iid < total) {
      issue(i, di, ij);
      next_issue();
    } else {
      asm volatile("cp.async.commit_group;");
    }
  }
  unsigned long long t_start = 0;
  unsigned h_mask = 0;  // the choices whose h this warp has helped copy
  for (int done = 0; cid < total; done++) {
    asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2) : "memory");
    __syncwarp();  // every lane's copies of this task landed; every lane done with the slot refilled next
    if (iid < total) {
      issue((done + STAGES - 1) % STAGES, di, ij);
      next_issue();
    } else {
      asm volatile("cp.async.commit_group;");
    }
    const int sl = cpos % Q;
    if (cj == warp) {  // this warp's first task of the item: its slot free (the item Q back summed)
      if (lane == 0)
        while (vfree[sl] != cpos - Q) __nanosleep(128);
      __syncwarp();
      if (dc.down && !(h_mask >> dc.p & 1)) {  // (each warp copies its share of a choice's h once)
        stage_h(dc.p);
        h_mask |= 1u << dc.p;
      }
      if (TIMELINE && cj == 0) t_start = now_ns();
    }
    float acc[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
    const float cs = dc.down ? (dc.ok ? route[dc.p] * s2d[dc.e] * unit : 0.f) : 1.f;
    if (cs != 0.f) {
      const int kb = dc.down ? cj % nkd : cj;
      const unsigned short* xk = (dc.down ? hs + (long)dc.p * I : xs) + (kb << 8);
      compute_chunk<2>(ws, xk, xz, lane, done % STAGES, acc);
    }
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int i = 0; i < 2; i++) {
        acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], 1);
        acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], 2);
      }
    float* rs = red + ((long)sl * tmax + cj) * 32;  // this task's sums: [tile][16 rows]
    if (c4 == 0) rs[g] = acc[0][0], rs[g + 8] = acc[0][1], rs[16 + g] = acc[1][0], rs[24 + g] = acc[1][1];
    __syncwarp();
    int old = 0;
    if (lane == 0) {
      __threadfence_block();
      old = atomicAdd(arrived + sl, 1);
    }
    if (__shfl_sync(0xffffffffu, old, 0) == dc.tasks - 1) {  // the item's last task: its sums, in task order
      __threadfence_block();
      const volatile float* vr = red + (long)sl * tmax * 32;
      const long ee = dc.ok ? dc.e : 0;
      if (!dc.down) {
        if (lane < 16) {
          float gt = 0.f, up = 0.f;
          for (int j = 0; j < dc.tasks; j++) gt += vr[j * 32 + lane], up += vr[j * 32 + 16 + lane];
          gt = fminf(gt * (s2g[2 * ee] * unit), limit);
          up = fminf(fmaxf(up * (s2g[2 * ee + 1] * unit), -limit), limit);
          const int n = 16 * dc.t + lane;
          const unsigned short hv = to_bf16(dc.ok ? gt / (1.f + __expf(-gt)) * up : 0.f);
          h[(long)dc.p * I + ((n & ~7) | ((n & 3) << 1) | ((n >> 2) & 1))] = (unsigned short)scale_x66(hv);
        }
        __syncwarp();
        if (lane == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" :: "l"(ready + dc.p) : "memory");
      } else {
        // rows 32 DG t + 32 pi + 16 r + i: task (pi, chunk) sums at [pi * nkd + chunk][16 r + i]
        float* mine = part + (long)dc.p * D + 32L * DG * dc.t;
#pragma unroll
        for (int pi = 0; pi < DG; pi++) {
          float sum = 0.f;
          for (int k = 0; k < nkd; k++) sum += vr[(pi * nkd + k) * 32 + lane];
          mine[32 * pi + lane] = sum * cs;
        }
        __syncwarp();
        int last = 0;
        if (lane == 0) asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(last) : "l"(group_cnt + dc.t)
                                    : "memory");
        if (__shfl_sync(0xffffffffu, last, 0) == top_k - 1) {  // the group's last choice: y, choice by choice
          const float* all = part + 32L * DG * dc.t;
#pragma unroll
          for (int pi = 0; pi < DG; pi++) {
            float sum = 0.f;
            for (int c = 0; c < top_k; c++) sum += __ldcg(all + (long)c * D + 32 * pi + lane);
            y[32L * DG * dc.t + 32 * pi + lane] = to_bf16(sum);
          }
          if (lane == 0) group_cnt[dc.t] = 0;
        }
      }
      if (TIMELINE && lane == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        marks[3 * cid + 1] = (long long)now_ns();
        marks[3 * cid + 2] = (long long)sm << 32 | blockIdx.x;
      }
      __syncwarp();
      if (lane == 0) {  // the slot is free for the position Q on
        arrived[sl] = 0;
        __threadfence_block();
        vfree[sl] = cpos;
      }
    }
    if (TIMELINE && lane == 0 && cj == 0) marks[3 * cid] = (long long)t_start;
    cj += KS;
    if (cj >= dc.tasks) {
      cj = warp, cid = item_at(++cpos);
      if (cid < total) dc = describe(cid);
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  if (warp == 0 && lane == 0 && f_pending >= 0) {  // (the counter's last answer in: the reset below comes after it)
    volatile int v = f_val;
    (void)v;
  }
  __threadfence();
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
    """warps: warps a block (at most the tasks of an item: D / 256 and down_pairs x I / 256); stages: tasks a warp
    holds in shared memory (stages - 1 loading while one computes); blocks_per_sm: blocks launched per SM (0: as
    many as fit); l2_prefetch: bytes L2 fetches with each 16-byte copy of W (0: no hint); down_pairs: pairs of row
    tiles a down item holds (its tasks: down_pairs x I / 256)."""
    warps: int = 16
    stages: int = 2
    blocks_per_sm: int = 1
    l2_prefetch: int = 256
    down_pairs: int = 2

    def __post_init__(self):
        if self.l2_prefetch not in (0, 64, 128, 256):
            raise ValueError(f"Config.l2_prefetch: must be 0, 64, 128 or 256 (bytes), got {self.l2_prefetch!r}")
        for name, lo, hi in (("warps", 1, 32), ("stages", 2, 6), ("blocks_per_sm", 0, 32), ("down_pairs", 1, 4)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise ValueError(f"Config.{name}: must be an int in {lo}..{hi}, got {v!r}")

    @property
    def slots(self) -> int:
        """Item positions a block keeps (more than the stages a warp looks ahead: see the source)."""
        return self.stages + 2

    def smem(self, d: int, inter: int, top_k: int) -> int:
        """Dynamic shared memory bytes a block uses: the warps' stages (two row tiles each), x, h of each choice,
        the slots' task sums."""
        tasks = max(d // 256, self.down_pairs * inter // 256)
        return (self.warps * self.stages * 2 * m1.TILE_STAGE_BYTES + 2 * d + 2 * top_k * inter
                + self.slots * tasks * 32 * 4)


def source(cfg: Config, timeline: bool = False) -> tuple[str, str]:
    """(CUDA source, kernel name); timeline: the kernel records each item's start, end and SM in `marks`."""
    name = (f"tpserve_nvfp4_m1_fused_w{cfg.warps}_st{cfg.stages}_dp{cfg.down_pairs}_p{cfg.l2_prefetch}"
            + ("_tl" if timeline else ""))
    defines = dict(KS=cfg.warps, STAGES=cfg.stages, Q=cfg.slots, IDQ=2 * cfg.slots + 4, FA=cfg.slots, DG=cfg.down_pairs,
                   NAME=name,
                   TIMELINE=int(timeline), MAX_TOP_K=MAX_TOP_K, **m1.helper_defines("shift", cfg.l2_prefetch))
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
        self.cnt = torch.zeros(2 + MAX_TOP_K + d // 32, dtype=torch.int32, device=device)
        self.part = torch.empty(MAX_TOP_K, d, dtype=torch.float32, device=device)
        self.h = torch.empty(MAX_TOP_K, inter, dtype=torch.bfloat16, device=device)


def items_of(cfg: Config, d: int, inter: int, top_k: int) -> int:
    """Work items of a call (a timeline's rows): gate|up (top_k x I / 16), then down."""
    return top_k * (inter // 16 + d // (32 * cfg.down_pairs))


def fits(x: torch.Tensor, ids: torch.Tensor, inter: int, cfg: Config | None = None) -> bool:
    """The shapes this kernel takes under cfg: one bf16 token, at most MAX_TOP_K choices, D and I multiples of 256,
    D of 32 x down_pairs, and items of at least as many tasks as a block has warps."""
    cfg = cfg or Config()
    d = x.shape[-1]
    return (x.dim() == 2 and x.shape[0] == 1 and x.dtype == torch.bfloat16 and ids.shape[-1] <= MAX_TOP_K
            and d % 256 == 0 and inter % 256 == 0 and d % (32 * cfg.down_pairs) == 0
            and cfg.warps <= min(d // 256, cfg.down_pairs * inter // 256))


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
                         f"{MAX_TOP_K}], D and I multiples of 256 and {cfg} fitting them (warps <= D / 256 and "
                         f"down_pairs x I / 256); got x {tuple(x.shape)} {x.dtype} on {x.device}, ids "
                         f"{tuple(ids.shape)}, weights {tuple(weights.shape)}, I = {inter}")
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
    launch_ex.reserve_smem(kernel, smem)
    fit = launch_ex.max_active_blocks(kernel, 32 * cfg.warps, smem)
    if fit < 1 or cfg.blocks_per_sm > fit:
        raise ValueError(f"cfg: {cfg} asks for {cfg.blocks_per_sm or 'the'} blocks an SM holds at once, at D {d}, "
                         f"I {inter}, top_k {top_k} ({smem} bytes of shared memory a block): the SM holds {fit}")
    args = [mg._aligned(gate_up, 16), gu_bscale.contiguous().view(torch.uint8), gu_scale2.float().contiguous(),
            mg._aligned(down, 16), dn_bscale.contiguous().view(torch.uint8), dn_scale2.float().contiguous(),
            mg._aligned(x, 16).view(torch.int16), ids.reshape(-1).to(torch.int64).contiguous(),
            weights.reshape(-1).float().contiguous(), ws.cnt, ws.part, ws.h.view(torch.int16),
            y.view(torch.int16), marks if marks is not None else ws.cnt, d, inter, top_k, num_experts,
            float("inf") if limit is None else float(limit)]
    kernel(grid=((cfg.blocks_per_sm or fit) * launch_ex.sms(device), 1, 1), block=(32 * cfg.warps, 1, 1),
           shared_mem=smem, args=args)
    return y
