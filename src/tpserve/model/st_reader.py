"""Read a whole safetensors file onto a device at disk speed.

safetensors' `load_file(device="cuda")` maps the file and copies tensor by tensor from pageable memory:
the disk is read by page faults, one tensor at a time (0.63 GB/s restoring a 16 GiB snapshot on the
H200 machine, BENCHMARKS.md). Here the data section is read with large `preadv` calls from several
threads at once (each releases the GIL), each thread into its own pinned staging buffer, then copied
to one device buffer on that thread's own stream; on the CPU the reads land in the result directly.
Tensors are views of that buffer (the file's bytes are all tensors, so nothing is wasted).

The format (safetensors' spec): 8 bytes little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data.
"""

from __future__ import annotations

import json
import math
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "U16": torch.uint16,
          "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64,
          "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
          "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
CHUNK_BYTES = 64 << 20
THREADS = 8


class SafetensorsError(ValueError):
    """A file that is not a well-formed safetensors file (named in the message)."""


def read_header(path: str | Path) -> tuple[dict, int, int]:
    """-> (tensor entries, data start offset, data length), checked against the file's size."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path}: {size} bytes, too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100 << 20):
            raise SafetensorsError(f"{path}: header length {n} exceeds the file ({size} bytes)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SafetensorsError(f"{path}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    for name, e in header.items():
        try:
            begin, end = e["data_offsets"]
            dtype = DTYPES[e["dtype"]]
            want = math.prod(e["shape"]) * dtype.itemsize
        except (KeyError, TypeError, ValueError) as exc:
            raise SafetensorsError(f"{path}: tensor {name!r}: bad entry {e!r} ({exc!r})") from None
        if not 0 <= begin <= end <= data_len or end - begin != want:
            raise SafetensorsError(f"{path}: tensor {name!r}: bytes [{begin}, {end}) do not hold {e['shape']} "
                                   f"{e['dtype']} within the file's {data_len} data bytes (truncated?)")
    return header, 8 + n, data_len


def load(path: str | Path, device: str | torch.device = "cpu", *, threads: int = THREADS,
         chunk_bytes: int = CHUNK_BYTES) -> dict[str, torch.Tensor]:
    """The file's tensors on `device`, as views of one buffer holding its data section."""
    device = torch.device(device)
    header, start, data_len = read_header(path)
    buf = torch.empty(data_len, dtype=torch.uint8, device=device)
    chunks = [(off, min(chunk_bytes, data_len - off)) for off in range(0, data_len, chunk_bytes)]
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        _read_chunks(fd, start, chunks, buf, device, max(1, min(threads, len(chunks))), chunk_bytes)
    finally:
        os.close(fd)
    out = {}
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        begin, end = e["data_offsets"]
        dtype = DTYPES[e["dtype"]]
        raw = buf[begin:end]
        if begin % dtype.itemsize:  # misaligned for a view (other writers may not pad): its own copy
            raw = raw.clone()
        out[name] = raw.view(dtype).view(e["shape"])
    return out


def _pread_into(fd: int, view: memoryview, offset: int) -> None:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise SafetensorsError(f"file descriptor {fd}: read ended at byte {offset + got} (file shrank?)")
        got += n


def _read_chunks(fd, start, chunks, buf, device, threads, chunk_bytes) -> None:
    if device.type == "cpu":
        host = memoryview(buf.numpy()).cast("B")
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda c: _pread_into(fd, host[c[0]:c[0] + c[1]], start + c[0]), chunks))
        return
    local = threading.local()
    staging = []  # kept alive until every copy has finished

    def one(c):
        off, n = c
        if not hasattr(local, "pinned"):
            local.pinned = torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True)
            local.view = memoryview(local.pinned.numpy()).cast("B")
            local.stream = torch.cuda.Stream(device)
            staging.append(local.pinned)
        local.stream.synchronize()  # the previous copy out of this thread's buffer is done
        _pread_into(fd, local.view[:n], start + off)
        with torch.cuda.stream(local.stream):
            buf[off:off + n].copy_(local.pinned[:n], non_blocking=True)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, chunks))
    torch.cuda.synchronize(device)
    del staging
