"""KDA's recurrences through fla-core's Triton kernels (CUDA): one-token decode on the state pool in place, verify
and commit rows in its speculative-decoding mode, and the start-up self-test against the torch references
(kda.py) that decides which of them a device uses."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tpserve.kernels.attention.kda import kda_chunked, kda_recurrent_batched


def fla_available() -> bool:
    try:
        import fla.ops.kda  # noqa: F401
    except Exception:  # fla-core needs triton and a GPU
        return False
    return True


def fla_decode_inplace(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                       states: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """One token per sequence through fla-core's recurrent kernel, reading and writing the state
    pool `states` [slots, H, K, V] in place at `slots` [B] (no gather / scatter of whole states).
    q, k, v, g [B, H, K]; beta [B, H] -> out [B, H, V]."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    # the kernel indexes rows as contiguous [B, T, H, K]: the layer's q, k, v are column slices of one
    # projection (row stride 3 H K), so they are made contiguous here
    q, k, v, g, beta = (x.contiguous().unsqueeze(1) for x in (q, k, v, g, beta))
    # out given: fla would zero-fill a new one (a launch), but one token per sequence writes every row
    out, _ = fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=states, inplace_final_state=True,
                                     ssm_state_indices=slots, use_qk_l2norm_in_kernel=True, out=torch.empty_like(v))
    return out.squeeze(1)


def recurrent_prefill(q, k, v, g, beta, initial_state: torch.Tensor, cu: torch.Tensor):
    """fla-core's recurrent kernel over the varlen rows cu (q ... [1, T, ...]) -> (out, final states), as
    `chunk` returns them: one launch, where chunk_kda's several and its host work cost more than the
    short sequences' token-by-token loop (--kda-short-prefill). The same loop body as decode's."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    return fused_recurrent_kda_fwd(q, k, v, g, beta, initial_state=initial_state, output_final_state=True,
                                   inplace_final_state=False, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                   out=torch.empty_like(v))  # every row written: no zero fill


def _fla_rows(b: int, n: int, states: torch.Tensor, index: tuple[torch.Tensor, torch.Tensor], q, k, v, g,
              beta) -> torch.Tensor:
    """fla-core's recurrent kernel over b sequences of n rows each (rows [b*n, ...], sequence-major) in its
    speculative-decoding mode: `index` = (state indices [b, n+1], accepted [b]) from `fla_verify_index` or
    `fla_commit_index`: each sequence starts from the pool state at column accepted-1 of its index row and
    writes the state after token t to column t. -> out [b*n, H, V]."""
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    idx, accepted = index
    rows = [x.contiguous().view(b, n, *x.shape[1:]) for x in (q, k, v, g, beta)]  # (no copy when contiguous)
    out, _ = fused_recurrent_kda_fwd(*rows, initial_state=states, inplace_final_state=True, ssm_state_indices=idx,
                                     num_accepted_tokens=accepted, use_qk_l2norm_in_kernel=True,
                                     out=torch.empty_like(rows[2]))  # every row written: no zero fill
    return out.view(b * n, *v.shape[1:])


def fla_verify_index(states: torch.Tensor, slots: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`_fla_rows`' index for a verify of n rows per sequence: read each slot (column n), write every
    per-token state to the dummy slot (the pool's last). The same for every KDA layer of a step."""
    cols = torch.arange(n + 1, device=slots.device)
    idx = torch.where(cols == n, slots.unsqueeze(1), states.shape[0] - 1)
    return idx, torch.full_like(slots, n + 1)


def fla_commit_index(states: torch.Tensor, slots: torch.Tensor, counts: torch.Tensor,
                     n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`_fla_rows`' index for a commit: read each slot (column n), write the state after row counts[i]-1 to
    it (column counts[i]-1; none when counts[i] is 0) and every other per-token state to the dummy slot.
    The same for every KDA layer of a step."""
    cols = torch.arange(n + 1, device=slots.device)
    pick = (cols == n) | (cols == counts.unsqueeze(1) - 1)
    return torch.where(pick, slots.unsqueeze(1), states.shape[0] - 1), torch.full_like(slots, n + 1)


def fla_verify(q, k, v, g, beta, states: torch.Tensor, slots: torch.Tensor, n: int,
               index: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Verify rows of a graph step (b = len(slots) sequences of n rows) in one kernel: row j's output is
    what the j-th of n one-token `fla_decode_inplace` steps gives (the same loop body of the same kernel);
    the slots are not written (the per-token states go to the dummy slot)."""
    index = fla_verify_index(states, slots, n) if index is None else index
    return _fla_rows(slots.shape[0], n, states, index, q, k, v, g, beta)


def fla_commit(q, k, v, g, beta, states: torch.Tensor, slots: torch.Tensor, counts: torch.Tensor, n: int,
               index: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """After acceptance: advance each slot by the first counts[i] of its n verified rows, in one kernel: the
    kernel runs all n rows and the slot receives the state after row counts[i]-1 (the same loop body as
    one-token decode steps, so bit for bit what they leave); the other per-token states go to the dummy slot."""
    index = fla_commit_index(states, slots, counts, n) if index is None else index
    _fla_rows(slots.shape[0], n, states, index, q, k, v, g, beta)


def _self_test_inputs(head_dim: int, lower_bound: float | None, device: torch.device, heads: int = 4):
    gen = torch.Generator(device).manual_seed(7)
    t = 80
    # q, k, v as the layer has them: column slices of one [t, 3 H K] tensor (not contiguous)
    mixed = torch.randn(t, 3 * heads * head_dim, generator=gen, device=device)
    q, k, v = (x.reshape(t, heads, head_dim) for x in mixed.split(heads * head_dim, dim=-1))
    raw = 2 * torch.randn(t, heads, head_dim, generator=gen, device=device)
    g = lower_bound * torch.sigmoid(raw) if lower_bound is not None else -F.softplus(raw)
    beta = torch.sigmoid(torch.randn(t, heads, generator=gen, device=device))
    states = 0.1 * torch.randn(2, heads, head_dim, head_dim, generator=gen, device=device)
    return q, k, v, g, beta, states


def chunk(q, k, v, g, beta, initial_state: torch.Tensor, cu: torch.Tensor, options: dict):
    """fla-core's chunk_kda over the varlen rows cu (q ... [1, T, ...]) -> (out, final states). With
    options["use_graph"] fla-core builds its chunk indices on the device, at a fixed size (sentinel rows
    past the last chunk): without it, it reads the sequence lengths on the host, a wait on the device
    for every new cu."""
    from fla.ops.kda import chunk_kda

    extra = {"max_num_seqs": cu.shape[0] - 1} if options.get("use_graph") else {}
    return chunk_kda(q, k, v, g, beta, initial_state=initial_state, output_final_state=True,
                     use_qk_l2norm_in_kernel=True, cu_seqlens=cu, **options, **extra)


def select_fla_options(head_dim: int, lower_bound: float | None, device: torch.device,
                       tolerance: float = 2e-3, device_indices: bool = False) -> tuple[bool, dict | None, str]:
    """Check fla-core's fused_recurrent_kda and chunk_kda against the torch references on this
    device and head size. -> (whether the recurrent kernel agrees: decode, verify and commit may
    use it; the chunk_kda options that agree, safe_gate with the lower bound first as the gate is
    bounded, or None: prefill chunks take the torch path; a report line). device_indices: each option set is
    tried first with the chunk indices built on the device (`chunk`), then without. The two are separate:
    at small head sizes the chunked kernel's lower-precision intra-chunk products can miss the
    bound while the recurrent kernel is exact to fp32 rounding."""
    q, k, v, g, beta, states = _self_test_inputs(head_dim, lower_bound, device)
    cuts = [0, 67, 80]  # two sequences, one longer than a 64-token chunk
    ref_o, ref_s = [], []
    for i in range(2):
        o, s = kda_chunked(*(x[cuts[i]:cuts[i + 1]] for x in (q, k, v, g, beta)), states[i])
        ref_o.append(o)
        ref_s.append(s)
    ref_o, ref_s = torch.cat(ref_o), torch.stack(ref_s)
    scale = max(1.0, ref_o.abs().max().item())
    cu = torch.tensor(cuts, dtype=torch.long, device=device)
    bases = ([dict(safe_gate=True, lower_bound=lower_bound)] if lower_bound is not None else []) + [{}]
    candidates = [opts for base in bases for opts in ([{**base, "use_graph": True}] if device_indices else []) + [base]]
    report = []
    step_o, step_s = kda_recurrent_batched(q[:2], k[:2], v[:2], g[:2], beta[:2], states)
    pool = torch.zeros(4, *states.shape[1:], device=device)  # the two states in slots 2 and 0 of a pool
    slots = torch.tensor([2, 0], device=device)
    pool[slots] = states
    o = fla_decode_inplace(q[:2], k[:2], v[:2], g[:2], beta[:2], pool, slots)
    rec_err = max((o - step_o).abs().max().item(), (pool[slots] - step_s).abs().max().item(),
                  pool[1].abs().max().item(), pool[3].abs().max().item())  # other slots untouched
    report.append(f"fused_recurrent_kda (in-place slots) err {rec_err:.1e}")
    if rec_err > tolerance * scale:
        return False, None, "; ".join(report) + " -> torch KDA path"
    for opts in candidates:
        o, s = chunk(q[None], k[None], v[None], g[None], beta[None], states.clone(), cu, opts)
        err = max((o[0] - ref_o).abs().max().item(), (s - ref_s).abs().max().item())
        report.append(f"chunk_kda {opts or 'default'} err {err:.1e}")
        if err <= tolerance * scale:
            return True, opts, "; ".join(report)
    return True, None, "; ".join(report) + " -> fla-core for decode / verify / commit, torch for prefill chunks"
