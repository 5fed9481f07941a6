"""fla-core's recurrent KDA kernel as the short-prefill path (--kda-short-prefill) drives it, in Triton's CPU
interpreter (run with Triton installed aside: tests/test_interpreter_suite.py). Its varlen rows must equal the
torch recurrence token by token: both run the same fp32 recurrence over at most 17 tokens of head size 16, so
they differ only in summation order, a few ulps a step (bound: 1e-5 of the outputs' scale). A layer's prefill
step takes it where every prefill sequence is short enough and chunk_kda otherwise."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from interpreted import run_interpreted  # noqa: E402

COMMON = """
import json
import torch
from tpserve.kernels.attention import kda as kda_ops
from tpserve.kernels.attention import kda_fla
H, D = 2, 16
"""


def test_varlen_rows_equal_the_torch_recurrence():
    out = run_interpreted(COMMON + """
gen = torch.Generator().manual_seed(0)
lens = [1, 5, 17]
t = sum(lens)
mixed = torch.randn(t, 3 * H * D, generator=gen)
q, k, v = (x.reshape(t, H, D) for x in mixed.split(H * D, dim=-1))  # strided, as in the layer
g = -torch.nn.functional.softplus(2 * torch.randn(t, H, D, generator=gen))
beta = torch.sigmoid(torch.randn(t, H, generator=gen))
init = 0.1 * torch.randn(len(lens), H, D, D, generator=gen)
cu = torch.tensor([0, 1, 6, 23])
o, final = kda_fla.recurrent_prefill(q[None], k[None], v[None], g[None], beta[None], init.clone(), cu)
errs, scale = [], 0.0
for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
    state = init[i]
    for r in range(a, b):
        want, state = kda_ops.kda_recurrent(q[r:r + 1], k[r:r + 1], v[r:r + 1], g[r:r + 1], beta[r:r + 1], state)
        errs.append((o[0, r] - want[0]).abs().max().item())
        scale = max(scale, want.abs().max().item())
    errs.append((final[i] - state).abs().max().item())
print(json.dumps({"err": max(errs), "scale": scale, "shape": list(o.shape), "finals": list(final.shape)}))
""")
    assert out["shape"] == [1, 23, 2, 16] and out["finals"] == [3, 2, 16, 16]
    assert out["err"] < 1e-5 * max(1.0, out["scale"]), out


def test_a_prefill_step_takes_the_recurrent_kernel_where_every_sequence_is_short():
    """A prefill-only step (5 and 17 tokens) of a KDA layer on the fla backend: with the switch at 17 or more
    it runs the recurrent kernel and equals the torch backend; below 17, chunk_kda (here a recorder)."""
    out = run_interpreted(COMMON + """
from tpserve.model.batch import CacheTensors, ForwardBatch
from tpserve.model.config import ModelConfig
from tpserve.model.kda import KdaAttention
from tpserve.model.layers import ShardContext
from tpserve.model.tiny import randomize_

chunked, recurrent = [], kda_fla.recurrent_prefill
def recorder(q, k, v, g, beta, init, cu, options):  # chunk_kda's stand-in: records the call
    chunked.append(cu.tolist())
    return recurrent(q, k, v, g, beta, init, cu)
kda_fla.chunk = recorder

cfg = ModelConfig(hidden_size=32, linear_num_heads=H, linear_head_dim=D // 2, num_hidden_layers=1,
                  layer_types=("linear_attention",), mlp_layer_types=("dense",), indexer_types=("full",))
layer = KdaAttention(ShardContext.single(torch.float32), cfg, 0)
randomize_(layer, seed=0)
slots, cu = [2, 0], [0, 5, 22]  # 5 and 17 tokens
t = cu[-1]
batch = ForwardBatch(input_ids=torch.zeros(t, dtype=torch.long), positions=torch.arange(t), cu_seqlens=cu,
                     context_lens=[0, 0], slots=torch.tensor(slots), block_tables=torch.zeros(2, 1, dtype=torch.long),
                     slot_mapping=torch.zeros(t, dtype=torch.long), logits_indices=torch.arange(t), decode_seqs=0)
x = torch.randn(t, 32, generator=torch.Generator().manual_seed(5))
runs = {}
for name, backend, short in (("torch", "torch", 0), ("recurrent", "fla", 17), ("chunk", "fla", 16)):
    cache = CacheTensors(block_size=16)
    gen = torch.Generator().manual_seed(1)
    cache.kda_state[0] = 0.1 * torch.randn(3, H, D // 2, D // 2, generator=gen)
    cache.conv_state[0] = torch.randn(3, 3 * H * D // 2, cfg.linear_conv_kernel_dim - 1, generator=gen)
    layer.backend, layer.fla_options, layer.short_prefill = backend, {}, short
    before = len(chunked)
    runs[name] = (layer(x, batch, cache), cache.kda_state[0].clone(), len(chunked) - before)
want_o, want_s, _ = runs["torch"]
got_o, got_s, calls = runs["recurrent"]
print(json.dumps({"err": max((got_o - want_o).abs().max().item(), (got_s - want_s).abs().max().item()),
                  "scale": want_o.abs().max().item(), "recurrent_chunk_calls": calls,
                  "chunk_calls": runs["chunk"][2], "chunk_cu": chunked}))
""")
    assert out["recurrent_chunk_calls"] == 0 and out["chunk_calls"] == 1 and out["chunk_cu"] == [[0, 5, 22]], out
    assert out["err"] < 1e-5 * max(1.0, out["scale"]), out
