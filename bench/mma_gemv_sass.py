"""kernels/mma_gemv.py and kernels/nvfp4_m1.py offline, no GPU: each config compiled by NVRTC to PTX, then by
ptxas to sm_90 SASS; prints registers, spills, shared memory and SASS instructions per weight in the K loop (per
thread: warp instructions x 32 / weights the loop's MMAs take, 16 x 16 each).

    LD_LIBRARY_PATH=DIR python bench/mma_gemv_sass.py [--configs fp8:2:4:2,nvfp4:1:8:2,m1:dense:1:4:4] [--ptxas PATH]

DIR holds libnvrtc.so.13 and its builtins (`pip install --target T nvidia-cuda-nvrtc==13.0.88`, then
DIR = T/nvidia/cu13/lib); ptxas defaults to Triton's copy. A config is fmt:rows:splits:depth[:min_blocks[:stage]]
(K chunks interleaved over the block's warps, L2 fetching 256 bytes, as the defaults; stage regs or smem);
m1:mode:rows:splits:stages is nvfp4_m1's (mode dense, gate_up, down or down_sum), then optionally :shift or :lut
(decode). The K loop is the code between the first and the last HMMA, plus nothing else: prologue, epilogue and
reduction are left out.
"""

from __future__ import annotations

import argparse
import ctypes
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from tpserve.kernels.quant import gemv_cuda as mg
from tpserve.kernels.quant import nvfp4_m1_cuda as m1


def ptx(source: str, arch: str = "90") -> str:
    lib = ctypes.CDLL("libnvrtc.so.13")
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = [f"--gpu-architecture=compute_{arch}".encode()]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if status:
        raise RuntimeError(log.value.decode())
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    out = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, out)
    return out.value.decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="fp8:2:4:2,fp8:1:8:2,nvfp4:2:4:2,nvfp4:1:8:2")
    ap.add_argument("--ptxas", default=None, help="default: Triton's backends/nvidia/bin/ptxas")
    args = ap.parse_args()
    ptxas = args.ptxas
    if ptxas is None:
        import triton

        ptxas = str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas")
    cuobjdump = str(Path(ptxas).parent / "cuobjdump")
    print("| config | registers | spills (bytes) | static smem | SASS in the K loop | a thread's instructions a "
          "weight | top opcodes |\n| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.configs.split(","):
            fmt, *rest = spec.split(":")
            if fmt == "m1":
                mode, rows, splits, stages, *decode = rest
                source, name = m1.source(m1.Config(int(rows), int(splits), int(stages), 256, *decode), mode)
            else:
                rows, splits, depth, *more = rest  # [min_blocks[:regs|smem]]
                cfg = mg.Config(fmt, int(rows), int(splits), int(depth), 256, True, int(more[0]) if more else 0,
                                *more[1:])
                source, name = mg.source(cfg), cfg.name
            text = ptx(source)
            text = re.sub(r"^\.version \d+\.\d+", ".version 8.7", text, flags=re.M)  # (an older ptxas reads it)
            src, cubin = Path(tmp) / f"{name}.ptx", Path(tmp) / f"{name}.cubin"
            src.write_text(text)
            info = subprocess.run([ptxas, "-arch=sm_90", "-v", "-O3", str(src), "-o", str(cubin)],
                                  capture_output=True, text=True, check=True).stderr
            regs = re.search(r"Used (\d+) registers", info).group(1)
            spill = re.search(r"(\d+) bytes spill stores", info).group(1)
            smem = (re.search(r"(\d+) bytes smem", info) or re.search("()", "")).group(1) or "0"
            sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
            ops = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9.]*)", sass)]
            hmma = [i for i, op in enumerate(ops) if op.startswith("HMMA")]
            loop = ops[hmma[0]:hmma[-1] + 1]
            weights = 256 * sum(op.startswith("HMMA") for op in loop)  # each MMA: 16 rows x 16 k of W
            top = ", ".join(f"{op} {n}" for op, n in Counter(o.split(".")[0] for o in loop).most_common(5))
            print(f"| {spec} | {regs} | {spill} | {smem} | {len(loop)} | {32 * len(loop) / weights:.2f} | {top} |")


if __name__ == "__main__":
    main()
