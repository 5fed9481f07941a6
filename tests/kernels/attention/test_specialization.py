"""Triton builds one binary per specialization of a kernel's arguments (an integer divisible by 16 or not, a pointer
aligned or not, each constexpr value). The kernels that take a block table's row stride must not specialize on it:
the width follows the longest context in a step, so the warm-up (engine/warmup.py) could not meet every class and
a long prompt would compile mid-request. Checked on CPU tensors with the CUDA backend's binder, no GPU needed
(run with Triton installed aside: tests/test_interpreter_suite.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

import torch  # noqa: E402

WIDTHS = (128, 129, 252, 256)  # blocks in a step's widest table: divisible by 16 and not


def _record(monkeypatch, module, names: tuple[str, ...]) -> list[tuple]:
    """Replace `module`'s kernels `names` by recorders -> the list each launch appends its specialization key to."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import create_function_from_signature

    backend, keys = CUDABackend(GPUTarget("cuda", 90, 32)), []

    class Recorder:
        def __init__(self, fn):
            self.binder = create_function_from_signature(fn.signature, fn.params, backend)

        def __getitem__(self, grid):
            def launch(*args, **kw):
                opts = {k: v for k, v in kw.items() if k not in ("num_warps", "num_stages")}
                keys.append(tuple(self.binder(*args, **opts)[1]))
            return launch

    for name in names:
        monkeypatch.setattr(module, name, Recorder(getattr(module, name)))
    return keys


def _per_value(keys: list, call, values=WIDTHS) -> dict[int, tuple]:
    """value -> the specialization keys of the launches `call(value)` made."""
    out = {}
    for value in values:
        keys.clear()
        call(value)
        out[value] = tuple(keys)
    return out


def _tables(width: int) -> torch.Tensor:
    return torch.arange(2 * width, dtype=torch.long).view(2, width)


def test_sparse_mla_builds_once_for_every_block_table_width(monkeypatch):
    from tpserve.kernels.attention import mla_triton

    n, heads, c, w = 300, 64, 512, 2064
    q = torch.randn(n, heads, c, dtype=torch.bfloat16)
    sel = torch.zeros(n, w, dtype=torch.long)
    seq = torch.zeros(n, dtype=torch.long)
    latent = torch.zeros(4096, c, dtype=torch.bfloat16)
    rec = _record(monkeypatch, mla_triton, ("_sparse_kernel", "_combine_kernel"))
    keys = _per_value(rec, lambda width: mla_triton.sparse_mla(q, sel, seq, _tables(width), latent, 64, 0.1,
                                                                 config=mla_triton.PREFILL))
    assert all(len(k) == 1 for k in keys.values())
    assert len(set(keys.values())) == 1, keys


def test_indexer_kernels_build_once_for_every_block_table_width(monkeypatch):
    from tpserve.kernels.attention import indexer_triton

    t, d, kpool, rows = 40, 128, 16, 4096
    pos, seq = torch.arange(t, dtype=torch.long), torch.zeros(t, dtype=torch.long)
    keys_cache, gates = torch.zeros(rows, d, dtype=torch.bfloat16), torch.zeros(rows, d, dtype=torch.bfloat16)
    ape, pool = torch.zeros(kpool, d, dtype=torch.float32), torch.zeros(rows // kpool, d, dtype=torch.bfloat16)
    q, w = torch.zeros(t, 32, d, dtype=torch.bfloat16), torch.zeros(t, 32, dtype=torch.float32)

    def both(width):
        indexer_triton.fill_pools(keys_cache, gates, ape, pos, seq, _tables(width), 64, pool)
        indexer_triton.decode_scores(q, w, pos, seq, _tables(width), pool, 64, kpool, 256)

    keys = _per_value(_record(monkeypatch, indexer_triton, ("_fill_pools_kernel", "_decode_scores_kernel")), both)
    assert all(len(k) == 2 for k in keys.values())
    assert len(set(keys.values())) == 1, keys


def test_top_pools_builds_once_per_tile_not_per_k(monkeypatch):
    from tpserve.kernels.attention import indexer_triton

    scores, pos = torch.zeros(4, 200, dtype=torch.float32), torch.arange(4, dtype=torch.long) * 999
    rec = _record(monkeypatch, indexer_triton, ("_top_pools_kernel",))
    # pools kept follow the context up to the indexer's top-k: one tile (C = 256) for these
    keys = _per_value(rec, lambda k: indexer_triton.top_pools(scores, pos, k, 16, chunked=False), (65, 100, 127))
    assert all(len(k) == 1 for k in keys.values())
    assert len(set(keys.values())) == 1, keys
