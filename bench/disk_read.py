"""How fast this machine's disk reads one large file, by method: through the page cache (what `model/st_reader.py`
does now) or around it (O_DIRECT), with T threads reading C-byte chunks.

    python bench/disk_read.py [--dir D] [--gib 8] [--configs buffered:8:64,direct:8:64,direct:32:16]

Writes a file of --gib GiB of random bytes under --dir (default: the current directory), syncs it, then for each
config drops the file's pages from the page cache (posix_fadvise DONTNEED after fsync) and times reading the
whole file into page-aligned host memory (each thread its own buffer; O_DIRECT needs aligned buffers, offsets
and lengths). Prints GB/s per config and the filesystem and block device the file lies on. The file is deleted at
the end. Issue 11 asks a snapshot restore of >= 3 GB/s per rank; the restore cannot beat what this measures.
"""

from __future__ import annotations

import argparse
import mmap
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from boot_snapshot import evict  # noqa: E402  (fsync, then the file's pages dropped from the page cache)

MIB = 1 << 20


def parse_configs(text: str) -> list[tuple[str, int, int]]:
    out = []
    for item in text.split(","):
        try:
            mode, threads, chunk = item.split(":")
            out.append((mode, int(threads), int(chunk)))
        except ValueError:
            raise ValueError(f"--configs: each item is mode:threads:chunk_mib, got {item!r}") from None
        if mode not in ("buffered", "direct") or out[-1][1] < 1 or out[-1][2] < 1:
            raise ValueError(f"--configs: mode buffered|direct, threads >= 1, chunk_mib >= 1; got {item!r}")
    return out


def write_file(path: str, size: int) -> None:
    block = os.urandom(64 * MIB)
    with open(path, "wb") as f, tqdm(total=size, unit="B", unit_scale=True, desc="writing") as bar:
        for _ in range(size // len(block)):
            f.write(block)
            bar.update(len(block))
        f.flush()
        os.fsync(f.fileno())


def read_all(path: str, mode: str, threads: int, chunk: int) -> float:
    """Seconds to read the whole file with `threads` threads of `chunk`-byte preadv calls."""
    size = os.path.getsize(path)
    flags = os.O_RDONLY | (os.O_DIRECT if mode == "direct" else 0)
    fd = os.open(path, flags)
    buffers = [mmap.mmap(-1, chunk) for _ in range(threads)]  # page-aligned
    offsets = list(range(0, size, chunk))

    def worker(i: int) -> None:
        view = memoryview(buffers[i])
        for off in offsets[i::threads]:
            n = min(chunk, size - off)
            got = 0
            while got < n:
                r = os.preadv(fd, [view[got:n]], off + got)
                if r <= 0:
                    raise OSError(f"read ended at byte {off + got}")
                got += r

    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(worker, range(threads)))
        return time.perf_counter() - start
    finally:
        os.close(fd)
        for b in buffers:
            b.close()


def where(path: str) -> str:
    out = subprocess.run(["df", "-hT", path], capture_output=True, text=True).stdout.strip().splitlines()
    return out[-1] if out else "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=".")
    ap.add_argument("--gib", type=int, default=8)
    ap.add_argument("--configs", default="buffered:8:64,direct:1:64,direct:8:64,direct:16:16,direct:32:16,"
                                         "direct:64:4,direct:32:64")
    args = ap.parse_args()
    try:
        configs = parse_configs(args.configs)
    except ValueError as exc:
        ap.error(str(exc))
    if args.gib < 1:
        ap.error("--gib: at least 1")
    path = os.path.join(args.dir, f".disk_read_{os.getpid()}.bin")
    size = args.gib << 30
    print(f"file system: {where(args.dir)}")
    try:
        t = time.perf_counter()
        write_file(path, size)
        print(f"write (with fsync): {size / 1e9 / (time.perf_counter() - t):.2f} GB/s")
        print("| mode | threads | chunk MiB | GB/s |")
        print("| --- | --- | --- | --- |")
        for mode, threads, chunk_mib in configs:
            evict([Path(path)])
            try:
                s = read_all(path, mode, threads, chunk_mib * MIB)
                print(f"| {mode} | {threads} | {chunk_mib} | {size / 1e9 / s:.2f} |", flush=True)
            except OSError as exc:
                print(f"| {mode} | {threads} | {chunk_mib} | failed: {exc} |", flush=True)
    finally:
        if os.path.exists(path):
            os.remove(path)


if __name__ == "__main__":
    main()
