"""fla-core's recurrent KDA kernel as the engine drives it on CUDA (skipped without a GPU and fla-core):
decode with the layer's strided q / k / v, and the graph verify / commit of speculative decoding, which
must equal one-token decode steps bit for bit (same kernel, same loop body)."""

import pytest
import torch

from tpserve.kernels.attention import kda as kda_ops
from tpserve.kernels.attention import kda_fla

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and kda_fla.fla_available()),
                                reason="needs CUDA and fla-core")

H, D = 4, 128


def _rows(t: int, seed: int):
    gen = torch.Generator("cuda").manual_seed(seed)
    mixed = torch.randn(t, 3 * H * D, generator=gen, device="cuda")
    q, k, v = (x.reshape(t, H, D) for x in mixed.split(H * D, dim=-1))  # strided, as in the layer
    g = -torch.nn.functional.softplus(2 * torch.randn(t, H, D, generator=gen, device="cuda"))
    beta = torch.sigmoid(torch.randn(t, H, generator=gen, device="cuda"))
    return q, k, v, g, beta


def _pool(slots: int, seed: int = 3):
    gen = torch.Generator("cuda").manual_seed(seed)
    return 0.1 * torch.randn(slots + 1, H, D, D, generator=gen, device="cuda")  # last: the dummy slot


def test_decode_with_strided_rows_matches_torch():
    q, k, v, g, beta = _rows(3, 0)
    pool = _pool(5)
    slots = torch.tensor([4, 0, 2], device="cuda")
    want_o, want_s = kda_ops.kda_recurrent_batched(q, k, v, g, beta, pool[slots])
    o = kda_fla.fla_decode_inplace(q, k, v, g, beta, pool, slots)
    scale = max(1.0, want_o.abs().max().item())
    assert (o - want_o).abs().max().item() < 2e-3 * scale
    assert (pool[slots] - want_s).abs().max().item() < 2e-3 * scale


def _decode_steps(rows, pool, slots, n, counts=None):
    """n one-token decode steps per sequence (rows sequence-major), each sequence stopping after counts[i]."""
    q, k, v, g, beta = rows
    b = slots.shape[0]
    outs = torch.zeros(b * n, H, D, device="cuda")
    for j in range(n):
        live = [i for i in range(b) if counts is None or j < counts[i]]
        if not live:
            continue
        r = torch.tensor([i * n + j for i in live], device="cuda")
        outs[r] = kda_fla.fla_decode_inplace(q[r], k[r], v[r], g[r], beta[r], pool, slots[live])
    return outs


def test_verify_equals_decode_steps_and_writes_no_slot():
    b, n = 3, 4
    rows = _rows(b * n, 1)
    pool = _pool(6)
    slots = torch.tensor([5, 1, 3], device="cuda")
    ref_pool = pool.clone()
    want = _decode_steps(rows, ref_pool, slots, n)
    before = pool.clone()
    got = kda_fla.fla_verify(*rows, pool, slots, n)
    assert torch.equal(got, want)
    assert torch.equal(pool[:-1], before[:-1])  # only the dummy slot may change


def test_commit_equals_counted_decode_steps():
    b, n = 4, 4
    rows = _rows(b * n, 2)
    pool = _pool(6)
    slots = torch.tensor([5, 1, 3, 0], device="cuda")
    counts = [0, 1, 3, 4]
    ref_pool = pool.clone()
    _decode_steps(rows, ref_pool, slots, n, counts)
    kda_fla.fla_commit(*rows, pool, slots, torch.tensor(counts, device="cuda"), n)
    assert torch.equal(pool[:-1], ref_pool[:-1])


def test_device_chunk_indices_give_the_host_form_bit_for_bit():
    """`kda_chunk_indices device` (fla-core's use_graph: chunk indices built on the device with sentinel rows) runs
    the same chunks as the host form: outputs and final states equal, for sequences shorter and longer than a
    64-token chunk."""
    cuts = [0, 13, 80, 380]
    q, k, v, g, beta = (x.to(torch.bfloat16) for x in _rows(cuts[-1], 5))
    states = _pool(len(cuts) - 2)[:len(cuts) - 1]
    cu = torch.tensor(cuts, device="cuda")
    rows = [x[None] for x in (q, k, v, g, beta)]
    o_host, s_host = kda_fla.chunk(*rows, states.clone(), cu, {})
    o_dev, s_dev = kda_fla.chunk(*rows, states.clone(), cu, {"use_graph": True})
    assert torch.equal(o_host, o_dev) and torch.equal(s_host, s_dev)


def test_recurrent_prefill_equals_one_token_decode_steps():
    """`--kda-short-prefill`: varlen prefill rows through the recurrent kernel give what one-token decode steps on
    the same kernel give, outputs and final states: the same fp32 loop body, compiled for another mode, so at most
    a contraction's rounding apart (1e-5 of the scale; the decode test's 2e-3 allows for the torch reference)."""
    cuts = [0, 1, 9, 40]
    rows = _rows(cuts[-1], 6)
    pool = _pool(len(cuts) - 1)
    init = pool[:len(cuts) - 1].clone()
    o, final = kda_fla.recurrent_prefill(*(x[None] for x in rows), init.clone(), torch.tensor(cuts, device="cuda"))
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        steps = pool.clone()
        steps[i] = init[i]
        slot = torch.tensor([i], device="cuda")
        for r in range(a, b):
            want = kda_fla.fla_decode_inplace(*(x[r:r + 1] for x in rows), steps, slot)
            assert (o[0, r] - want[0]).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item()), (i, r)
        assert (final[i] - steps[i]).abs().max().item() <= 1e-5 * max(1.0, steps[i].abs().max().item()), i
