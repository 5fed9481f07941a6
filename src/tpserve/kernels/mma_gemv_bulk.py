"""The W staging of kernels/mma_gemv.py's `stage="bulk"` configs: Hopper's bulk copies (TMA) feed a block-wide ring.

Why: on 4096 x 12288 the register loads reach 77% of the FP8 floor (BENCHMARKS.md, twenty-third to twenty-fifth
sessions). Nsight Compute found them latency-bound with too few bytes in flight: 256 blocks of 8 warps hold ~15
warps an SM, and neither more warps (16-warp blocks, two-block clusters) nor per-lane `cp.async` rings helped, since
each of those still spends warps and registers on every byte in flight. A bulk copy does not: one instruction asks
the copy engine for a whole run of a row, so the bytes in flight are set by the ring's size alone.

The block (rows x 16 rows of W, all of K) has `splits` consumer warps and one producer warp:
- The ring holds `depth` slots; a slot is `slot` 128-byte K chunks of each of the block's rows, each row's run
  padded by 64 bytes so that rows g and g + 1 land in opposite halves of the banks (the consumers' 16-byte reads
  of rows g, g + 1 then never meet in a bank).
- Producer: lane r copies row r's run into the slot with `cp.async.bulk`, completing on the slot's "full"
  mbarrier, whose expected bytes lane 0 sets first; before it refills a slot it waits on the slot's "empty"
  mbarrier. It reads only W, which no kernel writes, so under PDL it never waits for the kernel before.
- Consumers: warp w takes the slot's chunks w, w + splits, ... of every row tile, reads each lane's 16-byte pieces
  (the same bytes the register loads take) and runs mma_gemv's `compute` / `compute_fp4` on them; then one lane
  arrives on the slot's "empty" barrier. Under PDL they wait for the kernel before ahead of their first read of x.
- The consumers' sums meet as in the other stages (`finish`, on a named barrier without the producer).
"""

BULK_KERNEL = r"""
#ifndef COPY_ONLY  // (a measurement aid, bench/quant_decode_sweep.py --sections mmabulkcopy: the ring's W traffic
#define COPY_ONLY 0  // alone, no x and no sums; y is left unwritten)
#endif
#define BROWS (16 * R)                  // a block's rows of W
#define STRIDE (128 * SLOT_CHUNKS + 64)  // a row's run in a slot, padded
#define XRUN (128 * SLOT_CHUNKS * (FP4 ? 4 : 2))  // x's bytes of a row a slot covers (bf16)
#define XSTRIDE (XRUN + 16)
#define SLOT_BYTES (BROWS * STRIDE + 8 * XSTRIDE)  // W's rows, then x's (room for 8)

__device__ __forceinline__ void bar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void bar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}

__device__ __forceinline__ void bar_wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}

__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// FP8: s float32 block scales [ceil(N / BNS), SK = K / 128]; NVFP4: s e4m3 [N, SK = K / 16], s2 float32 [N]
extern "C" __global__ void __launch_bounds__(32 * (KS + 1)) NAME(
    const unsigned char* __restrict__ w, const void* __restrict__ s, const float* __restrict__ s2,
    const unsigned short* __restrict__ x, unsigned short* __restrict__ y, int M, int N, int K, int SK, int BNS) {
  __shared__ float red[KS > 1 ? KS - 1 : 1][R][4][32];
  __shared__ __align__(8) unsigned long long bars[2 * DEPTH];  // full[DEPTH], then empty[DEPTH]
  extern __shared__ __align__(128) unsigned char ring[];     // [DEPTH][BROWS][STRIDE]
#if PDL && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int row0 = blockIdx.x * BROWS;
  const long row_bytes = FP4 ? K / 2 : K;
  const int run = 128 * SLOT_CHUNKS, nslots = (int)((row_bytes + run - 1) / run);
  const unsigned full0 = (unsigned)__cvta_generic_to_shared(bars), empty0 = full0 + 8 * DEPTH;
  const unsigned ring0 = (unsigned)__cvta_generic_to_shared(ring);
  if (threadIdx.x == 0) {
    for (int i = 0; i < DEPTH; i++) {
      bar_init(full0 + 8 * i, 1);
      bar_init(empty0 + 8 * i, KS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == KS) {  // the producer: lane r < BROWS copies W's row r, lane m < M x's row m
    const unsigned char* wsrc = w + (long)min(row0 + lane, N - 1) * row_bytes;
    const unsigned char* xsrc = (const unsigned char*)x + (long)min(lane, M - 1) * K * 2;
    const int xscale = FP4 ? 4 : 2;  // x's bytes a W byte
    auto bytes_of = [&](int sl) { return (unsigned)min((long)run, row_bytes - (long)sl * run); };
    auto load_w = [&](int sl) {  // (the slot's expected bytes count x's too)
      const int st = sl % DEPTH;
      if (sl >= DEPTH) bar_wait(empty0 + 8 * st, ((sl / DEPTH) - 1) & 1);
      if (lane == 0) bar_expect(full0 + 8 * st, (BROWS + (COPY_ONLY ? 0 : M * xscale)) * bytes_of(sl));
      __syncwarp();
      if (lane < BROWS)
        bulk_copy(ring0 + st * SLOT_BYTES + lane * STRIDE, wsrc + (long)sl * run, bytes_of(sl), full0 + 8 * st);
    };
    auto load_x = [&](int sl) {
      const int st = sl % DEPTH;
      if (!COPY_ONLY && lane < M)
        bulk_copy(ring0 + st * SLOT_BYTES + BROWS * STRIDE + lane * XSTRIDE, xsrc + (long)sl * run * xscale,
                  bytes_of(sl) * xscale, full0 + 8 * st);
    };
    const int lead = min(nslots, DEPTH);
    for (int sl = 0; sl < lead; sl++) load_w(sl);  // W (no kernel writes it) before the PDL wait, x after
#if PDL && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    for (int sl = 0; sl < lead; sl++) load_x(sl);
    for (int sl = lead; sl < nslots; sl++) {
      load_w(sl);
      load_x(sl);
    }
    return;
  }
  const int g = lane >> 2, c = lane & 3;
  const float* srow[R];
  const unsigned char* slo[R];
  const unsigned char* shi[R];
#pragma unroll
  for (int r = 0; r < R; r++) {
    const int lo = min(row0 + 16 * r + g, N - 1), hi = min(row0 + 16 * r + g + 8, N - 1);
    srow[r] = (const float*)s + (long)(min(row0 + 16 * r, N - 1) / BNS) * SK;
    slo[r] = (const unsigned char*)s + (long)lo * SK + 2 * c;
    shi[r] = (const unsigned char*)s + (long)hi * SK + 2 * c;
  }
  const bool x_ok = g < M;
  float acc[R][4];
#pragma unroll
  for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = 0.f;
#if PDL && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // (y may be memory the kernel before still reads)
#endif
  for (int sl = 0; sl < nslots; sl++) {
    const int st = sl % DEPTH;
    const int nch = (int)min((long)SLOT_CHUNKS, (row_bytes >> 7) - (long)sl * SLOT_CHUNKS);
    bar_wait(full0 + 8 * st, (sl / DEPTH) & 1);
    const unsigned char* slot = ring + st * SLOT_BYTES + g * STRIDE + 16 * c;
    const unsigned short* xrow = (const unsigned short*)(ring + st * SLOT_BYTES + BROWS * STRIDE
                                                         + (x_ok ? g : 0) * XSTRIDE) + (FP4 ? 32 : 16) * c;
    for (int ch = warp; ch < (COPY_ONLY ? 0 : nch); ch += KS) {
      Chunk chunk;
#pragma unroll
      for (int r = 0; r < R; r++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
          chunk.lo[r][h] = *(const uint4*)(slot + 16 * r * STRIDE + 128 * ch + 64 * h);
          chunk.hi[r][h] = *(const uint4*)(slot + (16 * r + 8) * STRIDE + 128 * ch + 64 * h);
        }
      }
      if (FP4)
        compute_fp4(chunk, acc, slo, shi, xrow, x_ok, (long)sl * SLOT_CHUNKS + ch, ch);
      else
        compute(chunk, acc, srow, xrow, x_ok, (long)sl * SLOT_CHUNKS + ch, ch);
    }
    __syncwarp();
    if (lane == 0) bar_arrive(empty0 + 8 * st);
  }
  if (!COPY_ONLY) finish(acc, red, s2, y, M, N, row0, warp, lane);
}
"""
