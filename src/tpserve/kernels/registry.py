"""Every hot op once: its torch reference beside its fast backends, and `resolve`, which turns the switches
(`choice.Kernels`, already resolved for the device by engine/setup.py) into `Ops`, the frozen set of
implementations a model is built with (model/layers.ShardContext carries it to every module).

An op is registered in its subject's ops.py as name -> (switch, reference, backends, pdl): the `Kernels` field
that picks the backend, "module:function" of the torch reference (None where the calling layer's own torch code
is the path), {backend: "module:function"} of the fast ones, and whether they launch as programmatic dependents
under --pdl. A chosen backend is imported at its first call, so a CPU run never imports Triton. The quantized (and
16-bit) linears and the routed experts have one table each instead (quant/dispatch.py: `Ops.linear`,
`Ops.experts`).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

from tpserve.kernels.attention import ops as attention_ops
from tpserve.kernels.choice import Kernels
from tpserve.kernels.linear import ops as linear_ops
from tpserve.kernels.moe import ops as moe_ops
from tpserve.kernels.norms import ops as norms_ops
from tpserve.kernels.quant.dispatch import ExpertsDispatch, LinearDispatch

SUBJECTS = (norms_ops, linear_ops, moe_ops, attention_ops)


def registered() -> dict[str, tuple[str, str | None, dict[str, str], bool]]:
    """name -> (switch, reference, backends, pdl) of every registered op."""
    out = {}
    for subject in SUBJECTS:
        for name, entry in subject.OPS.items():
            if name in out:
                raise RuntimeError(f"op {name!r} registered twice")
            out[name] = entry
    return out


def _load(target: str) -> Callable:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class Bound:
    """One op as resolved: `op(...)` runs the chosen implementation (with pdl=True where it launches as a
    programmatic dependent), `op.plain(...)` the same without PDL, `op.reference` the torch form. Falsy where the
    switch says torch and the op has no torch form here (the calling layer's torch code is then the path)."""

    __slots__ = ("name", "backend", "pdl", "_target", "_ref", "_fn")

    def __init__(self, name: str, backend: str, target: str | None, ref: str | None, pdl: bool):
        self.name, self.backend, self.pdl = name, backend, pdl
        self._target, self._ref, self._fn = target, ref, None

    def __bool__(self) -> bool:
        return self._target is not None

    def _get(self) -> Callable:
        if self._fn is None:
            if self._target is None:
                raise RuntimeError(f"op {self.name}: no implementation on backend {self.backend} (the caller's torch "
                                   "form is the path)")
            self._fn = _load(self._target)
        return self._fn

    def __call__(self, *args, **kwargs):
        if self.pdl:
            return self._get()(*args, pdl=True, **kwargs)
        return self._get()(*args, **kwargs)

    def plain(self, *args, **kwargs):
        return self._get()(*args, **kwargs)

    @property
    def reference(self) -> "Bound":
        return Bound(self.name, "torch", self._ref, self._ref, False)

    def __repr__(self) -> str:
        return f"{self.name}={self.backend}" + (" (pdl)" if self.pdl else "")


class Ops:
    """The resolved ops: `ops.<name>` a `Bound` per registered op, `ops.linear` / `ops.experts` the dispatch tables,
    `ops.kernels` the switches they came from (also the settings that are no op: kda, mla_prefill,
    fused_collectives, weights)."""

    def __init__(self, kernels: Kernels, bound: dict[str, Bound], linear: LinearDispatch, experts: ExpertsDispatch):
        object.__setattr__(self, "kernels", kernels)
        object.__setattr__(self, "linear", linear)
        object.__setattr__(self, "experts", experts)
        for name, op in bound.items():
            object.__setattr__(self, name, op)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Ops is frozen: resolve() a new one")

    def __getattr__(self, name: str) -> Any:  # (only for names that are not there)
        raise AttributeError(f"no op {name!r} (registered: {', '.join(sorted(registered()))})")

    def describe(self) -> str:
        ops = [v for v in vars(self).values() if isinstance(v, Bound)]
        return ", ".join(repr(op) for op in ops) + f"; {self.linear!r}; {self.experts!r}"


@functools.lru_cache(maxsize=None)
def resolve(kernels: Kernels = Kernels()) -> Ops:
    """The implementation of every op for these switches (cached: one `Ops` per distinct `Kernels`)."""
    bound = {}
    for name, (switch, ref, backends, pdl) in registered().items():
        backend = getattr(kernels, switch)
        if backend == "torch":
            target = ref
        elif backend in backends:
            target = backends[backend]
        else:
            raise ValueError(f"{switch}_backend: {backend!r} is not a backend of op {name} "
                             f"(torch, {', '.join(sorted(backends))})")
        bound[name] = Bound(name, backend, target, ref, pdl and kernels.pdl and backend != "torch")
    # the grouped experts take the SwiGLU backend launched without PDL
    return Ops(kernels, bound, LinearDispatch(kernels.gemv, kernels.quant_gemv, kernels.pdl),
               ExpertsDispatch(kernels.moe, kernels.moe_triton_max_tokens, kernels.quant_gemv, kernels.moe_route,
                               bound["swiglu"].plain, kernels.quant_decode, kernels.quant_decode_fp8))
