"""Linears that read the same input, run as one GEMM over their weights stacked (vLLM's merged column and
QKV linears; switch `--merge-linears`).

A module lists its groups in `merged_linears` ({group: member linear names}): the dense MLP's gate and up,
KDA's q, k, v and its small f_a / b / g_a projections, MLA's q_a and kv_a. After loading, `merge` stacks a
group's 16-bit weights (no bias, no quantized layout) into one parameter `<group>_weight` on the module and
makes each member's weight a view of its rows, so the checkpoint names, the loader and the layers' own
calls stay as they are and nothing is held twice; snapshots store the stacked parameter and `merge` re-links
the views after a restore. `outputs(module, group, x)` then runs one GEMM (one weight stream, one launch at
decode) instead of one per member: at decode every member is a GEMV whose time is mostly latency. Groups with
a quantized or biased member stay separate calls. Each output element is the same dot product either way; only
the GEMM library's blocking (its summation order) may differ. Forwards of more than STACKED_MAX_ROWS rows
(prefill chunks) call the members one by one on their rows of the stack: there the GEMMs are compute-bound,
and apart measured no slower (BENCHMARKS.md, merged linears).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from tpserve.model.quant_methods import Bf16Linear

STACKED_MAX_ROWS = 256  # decode and verify steps (prefill chunks call the members apart)


@dataclass
class Group:
    module: nn.Module
    name: str
    members: list[nn.Module]  # model.layers.Linear
    rows: list[int]           # each member's output rows on this rank


def plan(model: nn.Module) -> list[Group]:
    """The groups that can be merged, from the model's layouts (works on the meta device, before loading)."""
    groups = []
    for mod in model.modules():
        for name, names in getattr(mod, "merged_linears", {}).items():
            members = [getattr(mod, n) for n in names]
            if all(type(m.quant) is Bf16Linear and m.bias is None for m in members) and \
                    len({(m.weight.dtype, m.weight.shape[1]) for m in members}) == 1:
                groups.append(Group(mod, name, members, [m.weight.shape[0] for m in members]))
    return groups


@torch.no_grad()
def merge(groups: list[Group]) -> None:
    """Stack each group's weights into `<name>_weight` (or take the one a snapshot restored) and point the
    members' weights at its rows."""
    for g in groups:
        key = f"{g.name}_weight"
        stacked = g.module._parameters.get(key)
        if stacked is None:
            stacked = nn.Parameter(torch.cat([m.weight for m in g.members]), requires_grad=False)
            g.module.register_parameter(key, stacked)
        if stacked.shape[0] != sum(g.rows):
            raise RuntimeError(f"merged linears {key}: {stacked.shape[0]} rows, the members have {sum(g.rows)}")
        for m, part in zip(g.members, stacked.data.split(g.rows)):
            m._parameters.pop("weight", None)
            m.weight = part  # a plain tensor attribute now: the parameter is the stacked one


def outputs(module: nn.Module, group: str, x: torch.Tensor, contiguous: bool = False) -> list[torch.Tensor]:
    """Each member of `group` applied to x: one GEMM when the group is merged (its parts are column slices of
    one output; `contiguous` copies them out where a consumer needs dense rows), else one call each."""
    members = [getattr(module, n) for n in module.merged_linears[group]]
    w = module._parameters.get(f"{group}_weight")
    if w is None or x.shape[0] > STACKED_MAX_ROWS:
        return [m(x) for m in members]
    y = stacked_linear(members[0], x, w)
    parts = y.split([m.weight.shape[0] for m in members], dim=-1)
    return [p.contiguous() for p in parts] if contiguous else list(parts)


def stacked(module: nn.Module, group: str, x: torch.Tensor) -> torch.Tensor:
    """The members' outputs side by side [..., sum of rows] (KDA's q | k | v): the merged GEMM's own output."""
    w = module._parameters.get(f"{group}_weight")
    if w is None or x.shape[0] > STACKED_MAX_ROWS:
        return torch.cat(outputs(module, group, x), dim=-1)
    return stacked_linear(getattr(module, module.merged_linears[group][0]), x, w)


def stacked_linear(first: nn.Module, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x W^T as the members' own bf16 forward computes it (their ops' linear dispatch)."""
    return first.ctx.ops.linear.bf16(x, w)
