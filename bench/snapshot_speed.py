"""Snapshot write / restore speed of model/snapshot.py on this machine's disk (CPU tensors).

A stand-in model of --gib GiB of bf16 parameters (8 tensors) is written, then restored into a meta
copy; restore is timed in its two passes (size + crc32 check, then load) and in all. The page
cache is not dropped (that needs root): a restore right after the write reads from memory, so this
measures the code's own cost, not the disk's.
Usage: python bench/snapshot_speed.py [--gib 1] [--dir /tmp/snapspeed]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time

import torch
from torch import nn


def model(gib: float, device: str) -> nn.Module:
    m = nn.Module()
    n = int(gib * 2**30 / 2 / 8 / 4096)
    for i in range(8):
        m.register_parameter(f"w{i}", nn.Parameter(torch.empty(n, 4096, dtype=torch.bfloat16, device=device),
                                                   requires_grad=False))
    return m


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--dir", default="/tmp/snapspeed")
    args = ap.parse_args()
    from tpserve.model.snapshot import SnapshotStore

    shutil.rmtree(args.dir, ignore_errors=True)
    src = model(args.gib, "cpu")
    for p in src.parameters():
        p.normal_()
    store = SnapshotStore(args.dir)
    key = {"bench": args.gib}
    size = sum(p.numel() * p.element_size() for p in src.parameters())
    t0 = time.perf_counter()
    store.write(src, key, 0, 1)
    t1 = time.perf_counter()
    assert store.check(key, 0, 1) is None
    t2 = time.perf_counter()
    dst = model(args.gib, "meta")
    t3 = time.perf_counter()
    assert store.restore(dst, key, 0, 1, torch.device("cpu"))
    t4 = time.perf_counter()
    assert all(torch.equal(a, b) for a, b in zip(src.parameters(), dst.parameters()))
    gb = size / 1e9
    print(f"{gb:.2f} GB: write {gb / (t1 - t0):.2f} GB/s; restore {gb / (t4 - t3):.2f} GB/s "
          f"(check pass alone {gb / (t2 - t1):.2f} GB/s)")
    shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
