"""KDA kernels: chunked == recurrent == transformers' references; conv step == conv over a sequence."""

import pytest
import torch
import torch.nn.functional as F

from tpserve.kernels.attention import conv
from tpserve.kernels.attention import kda


def _inputs(t, h=3, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(t, h, d, generator=g) for _ in range(3))
    gate = -5.0 * torch.sigmoid(torch.randn(t, h, d, generator=g))
    beta = torch.sigmoid(torch.randn(t, h, generator=g))
    state = 0.1 * torch.randn(h, d, d, generator=g)
    return q, k, v, gate, beta, state


@pytest.mark.parametrize("t", [1, 5, 64, 100])
def test_chunked_equals_recurrent(t):
    q, k, v, g, beta, s0 = _inputs(t)
    o1, s1 = kda.kda_recurrent(q, k, v, g, beta, s0)
    o2, s2 = kda.kda_chunked(q, k, v, g, beta, s0, chunk=16)
    torch.testing.assert_close(o1, o2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s1, s2, atol=1e-5, rtol=1e-5)


def test_batched_step_equals_recurrent():
    q, k, v, g, beta, s0 = _inputs(4)
    states = s0.unsqueeze(0).repeat(4, 1, 1, 1)
    out, new = kda.kda_recurrent_batched(q, k, v, g, beta, states)
    for b in range(4):
        o, s = kda.kda_recurrent(q[b:b + 1], k[b:b + 1], v[b:b + 1], g[b:b + 1], beta[b:b + 1], s0)
        torch.testing.assert_close(out[b], o[0])
        torch.testing.assert_close(new[b], s)


def test_matches_transformers_reference():
    from transformers.models.glm5_next import modeling_glm5_next as ref

    q, k, v, g, beta, s0 = _inputs(70)
    args = [x.unsqueeze(0) for x in (q, k, v)]
    o_ref, s_ref = ref.chunk_kimi_delta_attention(*args, g=g.unsqueeze(0), beta=beta.unsqueeze(0),
                                                  initial_state=s0.unsqueeze(0), output_final_state=True,
                                                  use_qk_l2norm_in_kernel=True)
    o, s = kda.kda_chunked(q, k, v, g, beta, s0)
    torch.testing.assert_close(o, o_ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, s_ref[0], atol=1e-5, rtol=1e-5)


def test_conv_step_equals_sequence():
    g = torch.Generator().manual_seed(0)
    c, kern, t = 6, 4, 9
    x = torch.randn(t, c, generator=g)
    w = torch.randn(c, kern, generator=g)
    state = torch.randn(c, kern - 1, generator=g)
    full, full_state = conv.causal_conv_seq(x, state, w)
    s = state.unsqueeze(0)
    for i in range(t):
        out, s = conv.causal_conv_step(x[i:i + 1], s, w)
        torch.testing.assert_close(out[0], full[i], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(s[0], full_state)
    # zero state == causal zero padding
    ref = F.silu(F.conv1d(x.t().unsqueeze(0), w.unsqueeze(1), padding=kern - 1, groups=c)[0, :, :t]).t()
    torch.testing.assert_close(conv.causal_conv_seq(x, torch.zeros(c, kern - 1), w)[0], ref)


def test_fla_backend_with_torch_chunks_equals_torch_backend(monkeypatch):
    """Where chunk_kda fails the start-up self-test but the recurrent kernel passes (the demo model's
    head size on an H200), the layer decodes through the fla kernel and prefills chunks through the
    torch path. A mixed step (two decodes, a 70-token chunk, a 1-token chunk) must equal the torch
    backend's outputs and states; the fla decode kernel is stood in for by the torch recurrence (it
    needs a GPU: tests/kernels/attention/test_kda_fla.py checks it there), so the rows' routing is what is tested."""
    from tpserve.model.batch import CacheTensors, ForwardBatch
    from tpserve.model.config import ModelConfig
    from tpserve.model.kda import KdaAttention
    from tpserve.model.layers import ShardContext
    from tpserve.model.tiny import randomize_

    def torch_inplace(q, k, v, g, beta, states, slots):
        out, new = kda.kda_recurrent_batched(q, k, v, g, beta, states[slots])
        states[slots] = new
        return out

    from tpserve.kernels.attention import kda_fla

    monkeypatch.setattr(kda_fla, "fla_decode_inplace", torch_inplace)
    cfg = ModelConfig(hidden_size=32, linear_num_heads=2, linear_head_dim=8, num_hidden_layers=1,
                      layer_types=("linear_attention",), mlp_layer_types=("dense",), indexer_types=("full",))
    layer = KdaAttention(ShardContext.single(torch.float32), cfg, 0)
    randomize_(layer, seed=0)
    lens, slots = [1, 1, 70, 1], [3, 0, 2, 4]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    t = cu[-1]
    batch = ForwardBatch(input_ids=torch.zeros(t, dtype=torch.long), positions=torch.arange(t), cu_seqlens=cu,
                         context_lens=[5, 9, 0, 0], slots=torch.tensor(slots),
                         block_tables=torch.zeros(len(lens), 1, dtype=torch.long),
                         slot_mapping=torch.zeros(t, dtype=torch.long), logits_indices=torch.arange(t), decode_seqs=2)
    x = torch.randn(t, 32, generator=torch.Generator().manual_seed(5))
    results = []
    for backend, opts in (("torch", {}), ("fla", None)):
        cache = CacheTensors(block_size=16)
        gen = torch.Generator().manual_seed(1)
        cache.kda_state[0] = 0.1 * torch.randn(6, 2, 8, 8, generator=gen)
        cache.conv_state[0] = torch.randn(6, 3 * 16, cfg.linear_conv_kernel_dim - 1, generator=gen)
        layer.backend, layer.fla_options = backend, opts
        results.append((layer(x, batch, cache), cache.kda_state[0].clone(), cache.conv_state[0].clone()))
    for want, got in zip(*results):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
