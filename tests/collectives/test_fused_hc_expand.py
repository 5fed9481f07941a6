"""All-reduce + mHC expand (collectives/fused.py): the torch definition is the model's expand, its error
bound holds for another evaluation order and catches a wrong formula, the argument checks, and
DecoderLayer's choice between the fused call and the two ops. Multi-rank: test_workspace_ring.py
(Communicator, world 3-4), test_tp.py (the model at TP=2, switch on and off) and
test_peer_workspace_interpreter.py (the CUDA kernel in Triton's interpreter)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tpserve.collectives import fused
from tpserve.collectives.comm import Communicator
from tpserve.model.mhc import HyperConnection

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def inputs(t: int, n: int, d: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    total = torch.randn(t, d, generator=g).to(dtype)
    streams = torch.randn(t, n, d, generator=g).to(dtype)
    post = torch.rand(t, n, generator=g) * 2          # fp32, as HyperConnection gives them
    comb = torch.rand(t, n, n, generator=g)
    return total, streams, post, comb


def kernel_order(total, streams, post, comb):
    """The CUDA kernel's evaluation order in torch: matmul over m = 0, 1, ... in float32."""
    dt = streams.dtype
    p, c = post.to(dt).float(), comb.to(dt).float()
    a = (p.unsqueeze(-1) * total.float().unsqueeze(-2)).to(dt)
    acc = torch.zeros(streams.shape, dtype=torch.float32)
    for m in range(streams.shape[1]):
        acc += c[:, m, :].unsqueeze(-1) * streams[:, m, :].float().unsqueeze(-2)
    return (a.float() + acc.to(dt).float()).to(dt)


@pytest.mark.parametrize("dtype", DTYPES)
def test_hc_expand_is_the_model_expand_and_the_bound_holds(dtype):
    total, streams, post, comb = inputs(5, 4, 300, dtype)
    ref = fused.hc_expand(total, streams, post, comb)
    assert ref.dtype == dtype and ref.shape == streams.shape
    assert torch.equal(HyperConnection.expand(total, streams, post, comb), ref)
    bound = fused.hc_expand_bound(total, streams, post, comb)
    exact = (post.to(dtype).double().unsqueeze(-1) * total.double().unsqueeze(-2)
             + torch.matmul(comb.to(dtype).double().transpose(-1, -2), streams.double()))
    assert bool(((ref.double() - exact).abs() <= bound / 2).all())  # one implementation
    assert bool(((kernel_order(total, streams, post, comb).double() - ref.double()).abs()
                 <= bound).all())
    # the bound has power: comb not transposed, or post left out, lands far outside it
    wrong = (post.to(dtype).unsqueeze(-1) * total.unsqueeze(-2)
             + torch.matmul(comb.to(dtype), streams))
    assert float(((wrong.double() - ref.double()).abs() / bound).max()) > 10
    assert float(((torch.matmul(comb.to(dtype).transpose(-1, -2), streams).double()
                   - ref.double()).abs() / bound).max()) > 10
    u = torch.finfo(dtype).eps / 2
    scale = (post.abs().unsqueeze(-1) * total.double().abs().unsqueeze(-2)
             + torch.matmul(comb.double().transpose(-1, -2), streams.double().abs()))
    assert float((bound / scale).max()) < 2.1 * 7 * u / (1 - 7 * u)  # 2 gamma(N + 3), N = 4


def test_world_one_is_the_expand_and_the_argument_checks():
    comm = Communicator(None, torch.device("cpu"))
    x, streams, post, comb = inputs(3, 4, 16, torch.float32, seed=1)
    got = comm.all_reduce_hc_expand(x, streams, post, comb)
    assert torch.equal(got, HyperConnection.expand(x, streams, post, comb))
    cases = [((x[0], streams, post, comb), "partial must be"),
             ((x, streams[:, :, :8], post, comb), "streams shape"),
             ((x, streams[:2], post, comb), "streams shape"),
             ((x, streams, post[:, :3], comb), "post shape"),
             ((x, streams, post, comb[:, :3]), "comb shape"),
             ((x, streams.double(), post, comb), "streams dtype"),
             ((x.long(), streams.long(), post, comb), "partial must be a floating"),
             ((x, streams, post.long(), comb), "post must be a floating"),
             ((x, streams, post, comb.double()), "comb dtype"),
             ((x, streams, post, comb.to("meta")), "comb is on meta")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            comm.all_reduce_hc_expand(*args)


class RecordingComm:
    def __init__(self):
        self.world_size, self.calls = 2, []

    def all_reduce(self, x):
        self.calls.append("all_reduce")
        return x

    def reduce_scatter(self, x, dim=0):
        self.calls.append("reduce_scatter")
        return x

    def all_reduce_hc_expand(self, partial, streams, post, comb):
        self.calls.append("all_reduce_hc_expand")
        return fused.hc_expand(partial, streams, post, comb)


@pytest.mark.parametrize("switch,sp,want", [(True, False, "all_reduce_hc_expand"),
                                            (False, False, "all_reduce"),
                                            (True, True, "reduce_scatter")])
def test_decoder_layer_takes_the_fused_call_where_it_applies(switch, sp, want):
    from tpserve.model.glm5_next import DecoderLayer

    comm = RecordingComm()
    layer = SimpleNamespace(fused_expand=switch, comm=comm)
    layer._reduce = lambda partial, batch: DecoderLayer._reduce(layer, partial, batch)
    x, streams, post, comb = inputs(2, 4, 8, torch.float32)
    out = DecoderLayer._reduce_expand(layer, SimpleNamespace(mix=HyperConnection.expand), x, streams, post, comb,
                                      SimpleNamespace(sequence_parallel=sp))
    assert comm.calls == [want]
    assert torch.equal(out, HyperConnection.expand(x, streams, post, comb))
