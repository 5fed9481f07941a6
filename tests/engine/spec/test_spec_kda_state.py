"""The KDA and conv states after verify rows and a commit of the accepted ones: what decoding the same
tokens one at a time leaves, bit for bit."""

import pytest
import torch

from tpserve.kernels.attention import conv
from tpserve.model.batch import CacheTensors, ForwardBatch
from tpserve.model.kda import KdaAttention, commit


def _kda_layer(seed=0):
    from tpserve.model.config import ModelConfig
    from tpserve.model.layers import ShardContext
    from tpserve.model.tiny import randomize_

    cfg = ModelConfig(hidden_size=32, linear_num_heads=2, linear_head_dim=8, num_hidden_layers=1,
                      layer_types=("linear_attention",), mlp_layer_types=("dense",), indexer_types=("full",))
    layer = KdaAttention(ShardContext.single(torch.float32), cfg, 0)
    randomize_(layer, seed=seed)
    return cfg, layer


def _cache(cfg, slots):
    c = CacheTensors(block_size=16)
    c.kda_state[0] = torch.randn(slots, cfg.linear_num_heads, 8, 8, generator=torch.Generator().manual_seed(1))
    c.conv_state[0] = torch.randn(slots, 3 * 16, cfg.linear_conv_kernel_dim - 1,
                                  generator=torch.Generator().manual_seed(2))
    return c


def _batch(lens, slots):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    t = cu[-1]
    return ForwardBatch(input_ids=torch.zeros(t, dtype=torch.long), positions=torch.arange(t), cu_seqlens=cu,
                        context_lens=[5] * len(lens), slots=torch.tensor(slots), block_tables=torch.zeros(len(lens), 1,
                        dtype=torch.long), slot_mapping=torch.zeros(t, dtype=torch.long),
                        logits_indices=torch.arange(t), decode_seqs=len(lens))


@pytest.mark.parametrize("accepted", [0, 1, 3])
def test_kda_state_after_rejection_equals_never_drafting(accepted):
    """Verify 1+3 rows of slot 1 next to a plain decode of slot 0, then commit 1+accepted of them: the
    slot's recurrent state and conv window are bit-identical to running the same inputs through the
    layer's one-token decode path, token by token (a run that never drafted)."""
    cfg, layer = _kda_layer()
    h, dh = layer.heads, layer.head_dim
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(3))
    spec_cache, plain_cache = _cache(cfg, 3), _cache(cfg, 3)
    layer(x, _batch([1, 4], [0, 1]), spec_cache)
    assert torch.equal(spec_cache.kda_state[0][1], plain_cache.kda_state[0][1])  # read, not written
    assert torch.equal(spec_cache.conv_state[0][1], plain_cache.conv_state[0][1])
    vi = spec_cache.verify[0]
    raw, g, beta, q_v = vi.raw.clone(), vi.g.clone(), vi.beta.clone(), vi.q.clone()
    commit(spec_cache, [1 + accepted])
    assert not spec_cache.verify
    one = _batch([1], [1])
    for j in range(1 + accepted):
        mixed = layer._conv(raw[j:j + 1], one, plain_cache.conv_state[0])
        q, k, v = (y.reshape(1, h, dh) for y in mixed.split(h * dh, dim=-1))
        assert torch.equal(q, q_v[j:j + 1])  # the verify row's conv output is the decode step's
        layer._torch(q, k, v, g[j:j + 1], beta[j:j + 1], one, plain_cache.kda_state[0])
    for key in ("kda_state", "conv_state"):
        assert torch.equal(getattr(spec_cache, key)[0][1], getattr(plain_cache, key)[0][1])
        assert torch.equal(getattr(spec_cache, key)[0][2], getattr(plain_cache, key)[0][2])  # untouched slot


def test_conv_verify_rows_equal_decode_steps():
    g = torch.Generator().manual_seed(0)
    x, state, w = torch.randn(5, 12, generator=g), torch.randn(12, 3, generator=g), torch.randn(12, 4, generator=g)
    rows, s = [], state[None]
    for j in range(5):
        out, s = conv.causal_conv_step(x[j:j + 1], s, w)
        rows.append(out)
    assert torch.equal(conv.causal_conv_verify(x, state, w), torch.cat(rows))


def test_kda_commit_of_several_verify_sequences():
    """Two verify sequences of different lengths next to a decode; commits of different counts (one of
    them 0: a finished sequence) advance exactly their own slots, as one-token decodes would."""
    cfg, layer = _kda_layer(seed=4)
    h, dh = layer.heads, layer.head_dim
    x = torch.randn(8, 32, generator=torch.Generator().manual_seed(5))
    spec_cache, plain_cache = _cache(cfg, 4), _cache(cfg, 4)
    layer(x, _batch([1, 4, 3], [0, 2, 1]), spec_cache)
    vi = spec_cache.verify[0]
    raw, g, beta = vi.raw.clone(), vi.g.clone(), vi.beta.clone()
    counts = [3, 0]
    commit(spec_cache, counts)
    for start, slot, n in ((0, 2, counts[0]), (4, 1, counts[1])):
        one = _batch([1], [slot])
        for j in range(start, start + n):
            mixed = layer._conv(raw[j:j + 1], one, plain_cache.conv_state[0])
            q, k, v = (y.reshape(1, h, dh) for y in mixed.split(h * dh, dim=-1))
            layer._torch(q, k, v, g[j:j + 1], beta[j:j + 1], one, plain_cache.kda_state[0])
    for key in ("kda_state", "conv_state"):
        for slot in (1, 2, 3):
            assert torch.equal(getattr(spec_cache, key)[0][slot], getattr(plain_cache, key)[0][slot])
