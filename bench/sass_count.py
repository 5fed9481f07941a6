"""Instructions per decoded weight in a quantized kernel's main loop, from the sm_90 SASS Triton writes (no GPU).

    TRITON_BACKENDS_IN_TREE=1 python bench/sass_count.py --kernel gemv --format nvfp4 --decode qtile-a \
        --block-n 64 --block-k 256 --warps 4

Compiles kernels/quant_gemv.py's GEMV or kernels/quant_triton.py's grouped gate / up kernel for an H100 / H200 with
the divisibility hints a real launch gives (16-byte aligned pointers and strides: without them every load is
narrow and the count misleading), finds its longest loop (the main loop), and prints its
instruction count divided by the weights each thread decodes per iteration, with the commonest opcodes, then
its registers and shared memory, the programs an SM can hold and the warps per scheduler (GEMV: for N rows). The
decode is bound by instruction issue (128 lane-operations per SM per clock), so this count, times the weights per
SM, over 128 and the clock, is the kernel's arithmetic time. Needs Triton with its CUDA backend and ptxas /
nvdisasm (the pip wheel has them; TRITON_BACKENDS_IN_TREE=1 finds the backend in a Triton put on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def compile_kernel(args):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    qtile = args.decode.startswith("qtile")
    qa = args.decode != "qtile-b"
    fp8 = args.format == "fp8"
    w = "*i16" if qtile else ("*fp8e4nv" if fp8 else "*u8")
    s = "*fp32" if fp8 else "*fp8e4nv"
    if args.kernel == "gemv" and fp8 and args.decode == "element":  # one row: FMAs, no dot
        from tpserve.kernels.quant import gemv_triton as qg

        fn = qg._fp8_row_kernel
        sig = dict(x_ptr="*bf16", w_ptr=w, s_ptr=s, y_ptr="*bf16", N="i32")
        ce = dict(K=args.k, SK=args.k // 128, BNS=128, BKS=128, K_PER_SPLIT=args.k, ATOMIC=False,
                  BLOCK_N=args.block_n, BLOCK_K=args.block_k, PREFETCH=args.prefetch)
        aligned = range(4)
    elif args.kernel == "gemv" and args.decode == "row":  # nvfp4, one row: nvfp4_codes then FMAs, no dot
        from tpserve.kernels.quant import gemv_triton as qg

        fn = qg._nvfp4_row_kernel
        sig = dict(x_ptr="*bf16", w_ptr="*i16", s_ptr=s, s2_ptr="*fp32", y_ptr="*bf16", N="i32")
        ce = dict(K=args.k, K_PER_SPLIT=args.k, ATOMIC=False, BLOCK_N=args.block_n, BLOCK_K=args.block_k, ASM=True,
                  F16=not args.bf16)
        aligned = range(5)
    elif args.kernel == "gemv" and args.decode == "planes":  # nvfp4, any M: nibble planes in the MMA's registers
        from tpserve.kernels.quant import gemv_triton as qg

        fn = qg._nvfp4_planes_kernel
        sig = dict(x_ptr="*bf16", w_ptr="*i16", s_ptr=s, s2_ptr="*fp32", y_ptr="*bf16", M="i32", N="i32")
        ce = dict(K=args.k, K_PER_SPLIT=args.k, ATOMIC=False, BLOCK_N=args.block_n, BLOCK_K=args.block_k, ASM=True,
                  X32=False)
        aligned = range(5)
    elif args.kernel == "gemv":
        from tpserve.kernels.quant import gemv_triton as qg

        fn = qg._gemv_kernel
        sig = dict(x_ptr="*bf16", w_ptr=w, s_ptr=s, s2_ptr="*fp32", y_ptr="*bf16", M="i32", N="i32")
        block_m = 1 if args.decode in ("fp32", "element") else 16
        ce = dict(K=args.k, SK=args.k // 128 if fp8 else args.k // 16, BNS=128 if fp8 else 1, BKS=128 if fp8 else 16,
                  FORMAT=0 if fp8 else 1, K_PER_SPLIT=args.k, ATOMIC=False, PRECISION="tf32", BLOCK_M=block_m,
                  BLOCK_N=args.block_n, BLOCK_K=args.block_k, DECODE32=args.decode == "fp32", QTILE=qtile, QA=qa,
                  ASM=qtile)
        aligned = range(5)
    else:
        from tpserve.kernels.quant import gemm_triton as qt

        fn = qt._qgate_up_kernel
        sig = dict(x_ptr="*bf16", w_ptr=w, s_ptr=s, s2_ptr="*fp32", h_ptr="*bf16", rows_ptr="*i32",
                   block_expert_ptr="*i32", num_experts="i32", limit="fp32", stride_we="i64", stride_se="i64",
                   stride_s2e="i64")
        ce = dict(top_k=8, D=args.k, INTER=2048, SK=args.k // 128 if fp8 else 0, BNS=128 if fp8 else 1,
                  BKS=128 if fp8 else 16, UP_SROW=16 if fp8 else 0, FORMAT=0 if fp8 else 1,
                  HOIST=fp8 and 128 % args.block_k == 0, PRECISION="tf32", BLOCK_M=16, BLOCK_N=args.block_n,
                  BLOCK_K=args.block_k, QTILE=2 if qtile else 0, QA=qa)
        aligned = (0, 1, 2, 3, 4, 5, 6, 9, 10, 11)
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    src = ASTSource(fn=fn, signature={**sig, **{c: "constexpr" for c in ce}}, constexprs=ce, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=args.warps, num_stages=args.stages))


SM_REGS, SM_SHARED, SM_WARPS, SM_PROGRAMS, SMS = 65536, 228 * 1024, 64, 32, 132  # H100 / H200, per SM


def occupancy(kernel, warps: int, programs: int | None = None) -> str:
    """Registers (cuobjdump -res-usage on the cubin, from Triton's own bin folder) and shared memory (Triton's
    metadata, plus the 1 KB the SM reserves per program) -> programs per SM and what limits them; with the
    grid's `programs`, its waves and the warps each scheduler can hold (the second call of the nineteenth
    session found the NVFP4 GEMVs at 1.6-2.7 of them, Nsight Compute's "active warps per scheduler")."""
    import subprocess
    import tempfile

    import triton.backends.nvidia as nv

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(Path(nv.__file__).parent / "bin" / "cuobjdump"), "-res-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    per_warp = -(-regs * 32 // 256) * 256  # registers are allocated per warp in 256s
    shared = kernel.metadata.shared + 1024
    limits = {"registers": SM_REGS // (per_warp * warps), "shared memory": SM_SHARED // shared,
              "warps": SM_WARPS // warps, "programs": SM_PROGRAMS}
    limit = min(limits, key=limits.get)
    per_sm = limits[limit]
    text = (f"{regs} registers, {shared / 1024:.1f} KB shared a program: {per_sm} programs per SM "
            f"(limited by {limit}), {per_sm * warps / 4:.1f} warps per scheduler when full")
    if programs:
        text += (f"; a grid of {programs} programs is {programs / (SMS * per_sm):.2f} waves, "
                 f"{min(per_sm, programs / SMS) * warps / 4:.1f} warps per scheduler")
    return text


def loop_opcodes(sass: str) -> list[str]:
    """Opcodes of the longest loop (a backward branch to a label; the kernel's main loop)."""
    lines = sass.splitlines()
    labels = {ln[:-1]: i for i, ln in enumerate(lines) if re.match(r"^\.?L\w+:$", ln)}
    start = end = None
    for i, ln in enumerate(lines):
        m = re.search(r"BRA\s+`?\(?(\.?L\w+)", ln)
        if (m and m.group(1) in labels and labels[m.group(1)] < i - 1
                and (start is None or i - labels[m.group(1)] > end - start)):
            start, end = labels[m.group(1)], i
    if start is None:
        raise SystemExit("no loop found in the SASS")
    return [re.sub(r"^@!?U?P\w+\s+", "", ln.split("\t", 1)[1].strip()).split()[0]
            for ln in lines[start:end + 1] if "\t" in ln]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=("gemv", "experts"), default="gemv")
    ap.add_argument("--format", choices=("nvfp4", "fp8"), default="nvfp4")
    ap.add_argument("--decode", choices=("qtile-a", "qtile-b", "fp32", "element", "row", "planes"),
                    default="qtile-a",
                    help="qtile as the MMA's A / B operand; the GEMV's float32-bits decode (nvfp4, one row) or "
                         "per-element path; row: the NVFP4 one-row kernel (nvfp4_codes, FMAs); planes: the NVFP4 "
                         "nibble-planes kernel (any M)")
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--block-k", type=int, default=256)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=12288, help="the GEMV's rows (for its grid, without K splits)")
    ap.add_argument("--prefetch", action="store_true", help="the FP8 row kernel's prefetch of the next K tile")
    ap.add_argument("--bf16", action="store_true", help="the NVFP4 row kernel's bf16 decode (default float16)")
    ap.add_argument("--stages", type=int, default=3, help="num_stages (Triton's software pipeline)")
    args = ap.parse_args()
    kernel = compile_kernel(args)
    ops = loop_opcodes(kernel.asm["sass"])
    # weights decoded per thread per iteration (gate and up: two tiles)
    per_thread = (2 if args.kernel == "experts" else 1) * args.block_n * args.block_k / (32 * args.warps)
    common = collections.Counter(o.split(".")[0] for o in ops).most_common(10)
    print(f"{args.kernel} {args.format} {args.decode} {args.block_n}x{args.block_k} {args.warps} warps: "
          f"{len(ops)} instructions per iteration, {len(ops) / per_thread:.2f} per weight; {common}")
    # one row's grid (GEMV, no K split): N / block_n programs
    print(occupancy(kernel, args.warps, -(-args.n // args.block_n) if args.kernel == "gemv" else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
