"""st_reader.load against safetensors' own loader: every dtype, odd sizes, chunks smaller than a tensor,
and malformed files as a named error."""

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from tpserve.model import st_reader


def _tensors():
    g = torch.Generator().manual_seed(0)
    out = {
        "f32": torch.randn(7, 13, generator=g),
        "bf16": torch.randn(3, 1001, generator=g).bfloat16(),
        "f16": torch.randn(5, generator=g).half(),
        "fp8": torch.randn(64, 33, generator=g).to(torch.float8_e4m3fn),
        "u8": torch.randint(0, 255, (17,), generator=g, dtype=torch.uint8),
        "i64": torch.randint(-9, 9, (4, 2), generator=g),
        "i32": torch.randint(-9, 9, (3,), generator=g, dtype=torch.int32),
        "bool": torch.rand(11, generator=g) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
    }
    return out


@pytest.mark.parametrize("chunk,threads", [(st_reader.CHUNK_BYTES, 8), (100, 3), (1, 1)])
def test_same_tensors_as_safetensors(tmp_path, chunk, threads):
    path = tmp_path / "a.safetensors"
    save_file(_tensors(), str(path), metadata={"k": "v"})
    want = load_file(str(path))
    got = st_reader.load(path, "cpu", threads=threads, chunk_bytes=chunk)
    assert got.keys() == want.keys()
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
        assert torch.equal(_bytes(got[name]), _bytes(w)), name  # bit for bit (NaN and -0 included)


def _bytes(t):
    return t.reshape(-1).view(torch.uint8)


def _write_raw(path, header: dict, data: bytes):
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def test_misaligned_offsets_are_copied_not_viewed(tmp_path):
    # a writer that does not pad: an f32 tensor at byte offset 1
    a, b = torch.tensor([7], dtype=torch.uint8), torch.tensor([1.5, -2.0])
    _write_raw(tmp_path / "m.safetensors", {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}},
               a.numpy().tobytes() + b.numpy().tobytes())
    got = st_reader.load(tmp_path / "m.safetensors")
    assert torch.equal(got["a"], a) and torch.equal(got["b"], b)


@pytest.mark.parametrize("case", ["short", "header-too-long", "not-json", "truncated-data", "bad-dtype"])
def test_malformed_files_are_named_errors(tmp_path, case):
    path = tmp_path / "bad.safetensors"
    ok = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    if case == "short":
        path.write_bytes(b"\x01\x02")
    elif case == "header-too-long":
        path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    elif case == "not-json":
        path.write_bytes(struct.pack("<Q", 3) + b"{x:")
    elif case == "truncated-data":
        _write_raw(path, ok, b"\0" * 10)
    else:
        _write_raw(path, {"w": {"dtype": "F7", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 16)
    with pytest.raises(st_reader.SafetensorsError, match="bad.safetensors"):
        st_reader.load(path)
