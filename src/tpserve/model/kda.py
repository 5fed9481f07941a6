"""KDA linear-attention layer (transformers' Glm5NextTextLinearAttention), heads split across ranks.

State lives in slots (CacheTensors.kda_state / conv_state), one per running sequence. A chunk of
several tokens runs the chunked form, a single token the recurrent form. On CUDA with
kda_backend "fla" the recurrences run in fla-core's Triton kernels over all sequences at once
(kernels/attention/kda_fla.py). With --kda-prep-backend triton the short conv and the gate run in Triton
(`ctx.ops.kda_conv_rows`, `kda_conv_chunk`, `kda_gate_beta`).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch
from torch import nn

from tpserve.kernels.attention import conv, kda_fla
from tpserve.kernels.attention import kda as kda_ops
from tpserve.model import merged
from tpserve.model.batch import CacheTensors, ForwardBatch
from tpserve.model.config import ModelConfig
from tpserve.model.h2d import to_device
from tpserve.model.layers import GatedRMSNorm, ShardContext, column, replicated, row
from tpserve.model.weights import Shard, add_source, declare


class KdaAttention(nn.Module):
    merged_linears = {"qkv": ("q_proj", "k_proj", "v_proj"), "fgb_a": ("f_a_proj", "g_a_proj", "b_proj")}

    def __init__(self, ctx: ShardContext, cfg: ModelConfig, layer: int):
        super().__init__()
        d, dh, qkv = cfg.hidden_size, cfg.linear_head_dim, cfg.linear_qkv_dim
        self.layer, self.head_dim, self.backend = layer, dh, ctx.ops.kernels.kda
        self.conv_rows, self.conv_chunk = ctx.ops.kda_conv_rows, ctx.ops.kda_conv_chunk  # falsy: `_conv`'s torch
        # the Triton gate has the lower-bound form only
        gate = ctx.ops.kda_gate_beta
        self.gate_beta = gate if cfg.linear_lower_bound is not None else gate.reference
        self.fla_options: dict | None = {}  # chunk_kda options chosen by the runner's self-test (None: torch chunks)
        self.short_prefill = ctx.ops.kernels.kda_short_prefill
        self.heads = ctx.split(cfg.linear_num_heads, "linear_num_heads")
        self.q_proj, self.k_proj, self.v_proj = (column(ctx, d, qkv) for _ in range(3))
        local, k = qkv // ctx.world, cfg.linear_conv_kernel_dim
        self.conv_weight = nn.Parameter(torch.empty(3 * local, 1, k), requires_grad=False)  # fp32: q|k|v
        for i, name in enumerate(("q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight")):
            add_source(self, name, (qkv, 1, k), Shard(dim=0), "conv_weight",
                       (slice(i * local, (i + 1) * local), Ellipsis), ctx.world)
        self.f_a_proj = replicated(ctx, d, dh)
        self.f_b_proj = column(ctx, dh, qkv)
        declare(self, "dt_bias", (qkv,), Shard(dim=0), dtype=ctx.dtype, world=ctx.world, fp32=True)
        declare(self, "A_log", (cfg.linear_num_heads,), Shard(dim=0), dtype=ctx.dtype, world=ctx.world, fp32=True)
        self.lower_bound = cfg.linear_lower_bound
        self.b_proj = column(ctx, d, cfg.linear_num_heads)
        self.g_a_proj = replicated(ctx, d, dh)
        self.g_b_proj = column(ctx, dh, qkv)
        self.o_norm = GatedRMSNorm(ctx, dh, cfg.rms_norm_eps)
        self.o_proj = row(ctx, qkv, d)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: CacheTensors) -> torch.Tensor:
        t, h, dh = x.shape[0], self.heads, self.head_dim
        raw = merged.stacked(self, "qkv", x)  # q | k | v
        fa, ga, b = merged.outputs(self, "fgb_a", x, contiguous=True)
        conv_states, saves = cache.conv_state[self.layer], batch.state_saves if batch.has_prefill else ()
        # the conv windows the saves start from, before this step's conv moves them
        old_conv = conv_states[_save_index(batch)[1]] if saves else None
        if self.conv_rows:
            q, k, v = (y.view(t, h, dh) for y in self._conv_fused(raw, batch, conv_states))
        else:
            mixed = self._conv(raw, batch, conv_states)
            q, k, v = (y.reshape(t, h, dh) for y in mixed.split(h * dh, dim=-1))
        g, beta = self.gate_beta(self.f_b_proj(fa), self.dt_bias, self.A_log, b, dh, self.lower_bound)
        states = cache.kda_state[self.layer]
        if saves:
            self._keep_states(raw, old_conv, (q, k, v, g, beta), batch, states, conv_states)
        if self.backend == "fla" and batch.fixed_shapes and batch.query_len > 1:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # once: fla's verify and commit read them
        nv = batch.single_token_seqs
        if nv < batch.decode_seqs:  # verify rows: read the states, commit later (`commit`)
            a, b = batch.cu_seqlens[nv], batch.decode_tokens
            cache.verify[self.layer] = VerifyInputs(batch.slots[nv:batch.decode_seqs],
                                                    [c - a for c in batch.cu_seqlens[nv:batch.decode_seqs + 1]],
                                                    raw[a:b], q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b],
                                                    fla=self.backend == "fla" and batch.fixed_shapes)
        if self.backend == "fla":
            out = self._fla(q, k, v, g, beta, batch, states)
        else:
            out = self._torch(q, k, v, g, beta, batch, states)
        gate = self.g_b_proj(ga).view(t, h, dh)
        return self.o_proj(self.o_norm(out, gate).reshape(t, h * dh))

    def _keep_states(self, raw: torch.Tensor, old_conv: torch.Tensor, qkvgb: tuple, batch: ForwardBatch,
                     states: torch.Tensor, conv_states: torch.Tensor) -> None:
        """batch.state_saves: the states of a prefill sequence after its first n rows of this step, computed
        from the states its slot holds before the step (the recurrence over those rows again, its outputs
        dropped) and written to a checkpoint slot. Equal to the states of a chunk that ended there."""
        spans, slots, ckpts, rows, cu = _save_index(batch)
        width = conv_states.shape[-1]
        windows = [torch.cat([old_conv[j].to(raw.dtype), raw[a:b].t()], dim=-1)[:, -width:]
                   for j, (a, b) in enumerate(spans)]
        conv_states[ckpts] = torch.stack(windows).to(conv_states.dtype)
        init = states[slots]
        if self.backend == "fla" and self.fla_options is not None:
            q, k, v, g, beta = (x[None, rows] for x in qkvgb)
            _, final = kda_fla.chunk(q, k, v, g, beta, init, cu, self.fla_options)
        else:
            final = torch.stack([(kda_ops.kda_recurrent if b - a == 1 else kda_ops.kda_chunked)(
                *(x[a:b] for x in qkvgb), init[j])[1] for j, (a, b) in enumerate(spans)])
        states[ckpts] = final.to(states.dtype)

    def _conv(self, mixed: torch.Tensor, batch: ForwardBatch, conv_states: torch.Tensor) -> torch.Tensor:
        weight = self.conv_weight.squeeze(1)
        if batch.fixed_shapes and batch.query_len > 1:  # a graph verify step: every sequence verifies
            b, n = batch.decode_seqs, batch.query_len
            out = conv.causal_conv_verify_uniform(mixed.view(b, n, -1), conv_states[batch.slots[:b]], weight)
            return out.reshape(b * n, -1)
        nd = batch.single_token_seqs
        if nd:
            slots = batch.slots[:nd]
            head, new = conv.causal_conv_step(mixed[:nd], conv_states[slots], weight)
            conv_states[slots] = new.to(conv_states.dtype)
            if nd == mixed.shape[0]:
                return head
        out = torch.empty_like(mixed)
        if nd:
            out[:nd] = head
        for i in range(nd, batch.num_seqs):
            a, b = batch.cu_seqlens[i], batch.cu_seqlens[i + 1]
            slot = batch.slots[i:i + 1]  # (a 1-element index: a 0-d device tensor as an index syncs the host)
            if i < batch.decode_seqs:  # verify rows: as decode steps; the state is committed after acceptance
                out[a:b] = conv.causal_conv_verify(mixed[a:b], conv_states[slot][0], weight)
                continue
            out[a:b], new = conv.causal_conv_seq(mixed[a:b], conv_states[slot][0], weight)
            conv_states[slot] = new.to(conv_states.dtype)[None]
        return out

    def _conv_fused(self, mixed: torch.Tensor, batch: ForwardBatch,
                    conv_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`_conv` with decode and verify rows through one Triton kernel (kernels/attention/kda_prep_triton.py; a
        verify row equals the decode step it stands for); prefill chunks through `conv_chunk`. -> q, k, v
        [T, C/3] each (contiguous when the step has no prefill). Steps with prefill launch it without PDL."""
        weight = self.conv_weight.squeeze(1)
        if batch.fixed_shapes and batch.query_len > 1:  # a graph verify step: every sequence verifies
            return self.conv_rows(mixed, conv_states, batch.slots[:batch.decode_seqs], weight, batch.query_len,
                                  False)
        nd = batch.single_token_seqs
        if nd == mixed.shape[0]:
            return self.conv_rows(mixed, conv_states, batch.slots[:nd], weight, 1, True)
        out = torch.empty_like(mixed)
        if nd:
            self.conv_rows.plain(mixed[:nd], conv_states, batch.slots[:nd], weight, 1, True, out=out[:nd])
        for i in range(nd, batch.num_seqs):
            a, b = batch.cu_seqlens[i], batch.cu_seqlens[i + 1]
            if i < batch.decode_seqs:  # verify rows: states read only, committed after acceptance
                self.conv_rows.plain(mixed[a:b], conv_states, batch.slots[i:i + 1], weight, b - a, False,
                                     out=out[a:b])
                continue
            slot = batch.slots[i:i + 1]
            _, new = self.conv_chunk(mixed[a:b], conv_states[slot][0], weight, out=out[a:b])
            conv_states[slot] = new.to(conv_states.dtype)[None]
        return tuple(out.split(out.shape[1] // 3, dim=-1))

    def _torch(self, q, k, v, g, beta, batch: ForwardBatch, states: torch.Tensor) -> torch.Tensor:
        if batch.fixed_shapes and batch.query_len > 1:  # a graph verify step: states read, not written
            b = batch.decode_seqs
            return verify_uniform(q, k, v, g, beta, b, batch.query_len, states[batch.slots[:b]])
        nd = batch.single_token_seqs
        if nd:
            slots = batch.slots[:nd]
            head, new = kda_ops.kda_recurrent_batched(q[:nd], k[:nd], v[:nd], g[:nd], beta[:nd], states[slots])
            states[slots] = new
            if nd == q.shape[0]:
                return head
        out = torch.empty_like(v)
        if nd:
            out[:nd] = head
        if nd < batch.decode_seqs:  # verify: the decode update position by position, states not stored
            cu = batch.cu_seqlens[nd:batch.decode_seqs + 1]
            decode_positions(q, k, v, g, beta, cu[:-1], [b - a for a, b in zip(cu, cu[1:])],
                             states[batch.slots[nd:batch.decode_seqs]], out)
        _prefill_torch(q, k, v, g, beta, batch, states, out)
        return out

    def _fla(self, q, k, v, g, beta, batch: ForwardBatch, states: torch.Tensor) -> torch.Tensor:
        if batch.fixed_shapes and batch.query_len > 1:  # a graph verify step: one kernel, slots not written
            slots, n = batch.slots[:batch.decode_seqs], batch.query_len
            index = batch.memoized(("fla_verify_index", n), lambda: kda_fla.fla_verify_index(states, slots, n))
            return kda_fla.fla_verify(q, k, v, g, beta, states, slots, n, index)
        nd = batch.single_token_seqs
        parts = []
        if nd:  # decode: the state pool is read and written in place at the slots
            parts.append(kda_fla.fla_decode_inplace(q[:nd], k[:nd], v[:nd], g[:nd], beta[:nd], states,
                                                    batch.slots[:nd]))
        if nd < batch.decode_seqs:  # verify rows: the torch decode update, states not written
            sub = dataclasses.replace(batch, cu_seqlens=[c - batch.cu_seqlens[nd] for c in
                                                         batch.cu_seqlens[nd:batch.decode_seqs + 1]],
                                      context_lens=batch.context_lens[nd:batch.decode_seqs],
                                      slots=batch.slots[nd:batch.decode_seqs], decode_seqs=batch.decode_seqs - nd)
            a, b = batch.cu_seqlens[nd], batch.decode_tokens
            parts.append(self._torch(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], sub, states))
            nd = batch.decode_seqs
        if nd < batch.num_seqs and self.fla_options is None:  # chunk_kda failed the self-test here
            out = torch.empty_like(v)
            _prefill_torch(q, k, v, g, beta, batch, states, out)
            parts.append(out[batch.cu_seqlens[nd]:])
        elif nd < batch.num_seqs:
            slots, a = batch.slots[nd:], batch.cu_seqlens[nd]
            # one tensor for every layer: fla-core keeps what it derives from it on the host (its chunk indices)
            cu = batch.memoized(("kda_prefill_cu", nd),
                                lambda: to_device([c - a for c in batch.cu_seqlens[nd:]], q.device, torch.long))
            rows = (q[None, a:], k[None, a:], v[None, a:], g[None, a:], beta[None, a:])
            if self.short_prefill and batch.memoized(("kda_longest_prefill", nd), lambda: max(
                    e - s for s, e in zip(batch.cu_seqlens[nd:], batch.cu_seqlens[nd + 1:]))) <= self.short_prefill:
                out, final = kda_fla.recurrent_prefill(*rows, states[slots], cu)
            else:
                out, final = kda_fla.chunk(*rows, states[slots], cu, self.fla_options)
            states[slots] = final
            parts.append(out.squeeze(0))
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _save_index(batch: ForwardBatch) -> tuple:
    """batch.state_saves, once a step: the rows each save recomputes (host spans), then on the device the
    sequences' slots, the checkpoint slots, those rows and their offsets (varlen cu_seqlens)."""
    def build():
        saves, dev = batch.state_saves, batch.slots.device
        spans = [(batch.cu_seqlens[i], batch.cu_seqlens[i] + n) for i, n, _ in saves]
        on = lambda values: to_device(values, dev, torch.long)  # noqa: E731
        return (spans, batch.slots[on([i for i, _, _ in saves])], on([c for _, _, c in saves]),
                on([r for a, b in spans for r in range(a, b)]),
                on([0, *itertools.accumulate(b - a for a, b in spans)]))
    return batch.memoized(("kda_state_saves",), build)


def _prefill_torch(q, k, v, g, beta, batch: ForwardBatch, states: torch.Tensor, out: torch.Tensor) -> None:
    """The prefill chunks (sequences after the decode group), one at a time, into out's rows."""
    for i in range(batch.decode_seqs, batch.num_seqs):
        a, b = batch.cu_seqlens[i], batch.cu_seqlens[i + 1]
        slot = batch.slots[i:i + 1]
        fn = kda_ops.kda_recurrent if b - a == 1 else kda_ops.kda_chunked
        out[a:b], new = fn(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], states[slot][0])
        states[slot] = new[None]


@dataclass
class VerifyInputs:
    """One step's verify rows of a KDA layer: what committing their accepted prefixes needs."""

    slots: torch.Tensor       # [S] the verify sequences' state slots
    offsets: list[int]        # [S+1] each sequence's rows
    raw: torch.Tensor         # [N, conv] conv inputs (q|k|v projections before the conv)
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    fla: bool = False         # verified by fla-core's kernel (a graph step): committed by it too


def commit(cache: CacheTensors, counts: list[int]) -> None:
    """After acceptance: replay the first counts[i] verified tokens of verify sequence i through the
    plain decode update (the conv window shift and the recurrent step of a one-token decode), so each
    slot's state is exactly what decoding those tokens one by one without drafts would leave.
    Consumes every layer's VerifyInputs."""
    for layer, vi in cache.verify.items():
        if len(counts) != len(vi.offsets) - 1:
            raise ValueError(f"commit: {len(counts)} counts for {len(vi.offsets) - 1} verify sequences")
        live = [i for i, n in enumerate(counts) if n > 0]
        if not live:
            continue
        dev = vi.raw.device
        sel = torch.tensor(live, device=dev)
        slots, n = vi.slots[sel], torch.tensor([counts[i] for i in live], device=dev)
        starts = torch.tensor([vi.offsets[i] for i in live], device=dev)
        states, convs = cache.kda_state[layer], cache.conv_state[layer]
        width = int(max(counts))
        rows = (starts.unsqueeze(1) + torch.arange(width, device=dev)).clamp(max=vi.raw.shape[0] - 1)
        _advance_conv(convs, slots, vi.raw[rows], n)
        states[slots] = decode_positions(vi.q, vi.k, vi.v, vi.g, vi.beta, [vi.offsets[i] for i in live],
                                         [counts[i] for i in live], states[slots])
    cache.verify.clear()


def _conv_columns(counts: torch.Tensor, window: int) -> torch.Tensor:
    """Columns of [window | rows] that are each sequence's new window: counts[i] .. counts[i] + window - 1."""
    return counts.unsqueeze(1) + torch.arange(window, device=counts.device)


def _advance_conv(convs: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, counts: torch.Tensor,
                  cols: torch.Tensor | None = None) -> None:
    """Each slot's conv window becomes the last k-1 inputs of [its window | its first counts[i] rows]
    (rows [S, width, C]), by index: copies only, no arithmetic. cols: `_conv_columns` of counts."""
    ext = torch.cat([convs[slots], rows.transpose(1, 2).to(convs.dtype)], dim=-1)      # [S, C, k-1+width]
    cols = _conv_columns(counts, convs.shape[-1]) if cols is None else cols
    convs[slots] = ext.gather(-1, cols.unsqueeze(1).expand(-1, ext.shape[1], -1))


def _position(n: int, j: int, *xs: torch.Tensor) -> list[torch.Tensor]:
    """Row j of every sequence of n rows each (uniform layout [B * n, ...]), contiguous [B, ...]."""
    return [x.view(-1, n, *x.shape[1:])[:, j].contiguous() for x in xs]


def verify_uniform(q, k, v, g, beta, b: int, n: int, states: torch.Tensor) -> torch.Tensor:
    """Verify rows of a graph step, b sequences of n rows each: the one-token decode update position by
    position from each sequence's state (states [b, H, K, V], a copy; nothing is stored) -> out [b*n, H, V]."""
    out = torch.empty_like(v).view(b, n, *v.shape[1:])
    for j in range(n):
        o, states = kda_ops.kda_recurrent_batched(*_position(n, j, q, k, v, g, beta), states)
        out[:, j] = o.to(out.dtype)
    return out.view(b * n, *v.shape[1:])


def commit_uniform(cache: CacheTensors, verify: dict[int, "VerifyInputs"], counts: torch.Tensor) -> None:
    """`commit` for a graph verify step (every sequence n rows; counts [b] a device tensor), with fixed
    shapes and no host values: the update runs for every sequence at every position and is kept where
    j < counts[i]. The same arithmetic as `commit` on the same rows. What depends only on the slots and
    counts (fla's state index, the conv window's columns) is computed once for every layer."""
    shared = {}
    for layer, vi in verify.items():
        b, n = vi.slots.shape[0], vi.offsets[1] - vi.offsets[0]
        states, convs = cache.kda_state[layer], cache.conv_state[layer]
        if "cols" not in shared:
            shared["cols"] = _conv_columns(counts, convs.shape[-1])
        _advance_conv(convs, vi.slots, vi.raw.view(b, n, -1), counts, shared["cols"])
        if vi.fla:
            if "index" not in shared:
                shared["index"] = kda_fla.fla_commit_index(states, vi.slots, counts, n)
            kda_fla.fla_commit(vi.q, vi.k, vi.v, vi.g, vi.beta, states, vi.slots, counts, n, shared["index"])
            continue
        s = states[vi.slots]
        for j in range(n):
            _, new = kda_ops.kda_recurrent_batched(*_position(n, j, vi.q, vi.k, vi.v, vi.g, vi.beta), s)
            s = torch.where((counts > j).view(-1, 1, 1, 1), new, s)
        states[vi.slots] = s


def decode_positions(q, k, v, g, beta, starts: list[int], lens: list[int], states: torch.Tensor,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """The one-token decode update (kda_recurrent_batched) at rows starts[i] + j, j < lens[i], position
    by position with every sequence at once. states [S, H, K, V]: a copy, advanced in place and
    returned; out: where each row's output goes (optional)."""
    dev = q.device
    for j in range(max(lens, default=0)):
        live = [i for i, n in enumerate(lens) if n > j]
        rows = torch.tensor([starts[i] + j for i in live], device=dev)
        if len(live) == len(lens):
            o, states = kda_ops.kda_recurrent_batched(q[rows], k[rows], v[rows], g[rows], beta[rows], states)
        else:
            sel = torch.tensor(live, device=dev)
            o, states[sel] = kda_ops.kda_recurrent_batched(q[rows], k[rows], v[rows], g[rows], beta[rows],
                                                           states[sel])
        if out is not None:
            out[rows] = o.to(out.dtype)
    return states
