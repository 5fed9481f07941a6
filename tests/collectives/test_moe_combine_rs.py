"""The MoE combine folded into the reduce-scatter (Communicator.reduce_scatter_moe_combine,
collectives/fused.py): the torch definition, its blocks bitwise slices of the whole, the argument checks,
the model's hand-over (MoE.forward_unreduced, DecoderLayer._reduce); on the CPU shared-memory
workspace at world 2, 3 and 4 the fused collective bitwise equal to the combine followed by the
reduce-scatter (fp32 / bf16, odd token counts, k 1 and 8, with and without shared experts, strided
and empty inputs, single and many rounds, rows split across rounds); and greedy tokens and SP
prefill logits identical with the fold on and off at TP=2 on CPU. The CUDA kernel runs in Triton's
interpreter in test_peer_workspace_interpreter.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from tpserve.collectives import fused
from tpserve.collectives.comm import Communicator
from tpserve.engine.tp.launch import spawn_ranks

WORKSPACE_BYTES = 40 << 10  # 4 slots of ~9 KiB: the larger cases take many rounds, a 3000-wide
# row does not fit one rank's share of a slot and is split by columns


def moe_inputs(t: int, k: int, d: int, dtype: torch.dtype, seed: int, shared: bool = True,
               experts: int = 16):
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(t * k, d, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(t)]) if t else \
        torch.zeros(0, k, dtype=torch.int64)
    order = torch.argsort(ids.reshape(-1), stable=True)
    weights = torch.rand(t, k, generator=g)
    sh = torch.randn(t, d, generator=g).to(dtype) if shared else None
    return y, order, weights, sh


def loop_combine(y, order, weights, shared):
    """The definition element by element: sum_j fp32(w[t, j]) * fp32(y[inv[t*k + j]]) in fp32,
    j in order, rounded once; + shared in the dtype."""
    t, k = weights.shape
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel())
    out = torch.empty(t, y.shape[1], dtype=y.dtype)
    for i in range(t):
        acc = weights[i, 0].float() * y[inv[i * k]].float()
        for j in range(1, k):
            acc = acc + weights[i, j].float() * y[inv[i * k + j]].float()
        out[i] = acc.to(y.dtype) if shared is None else acc.to(y.dtype) + shared[i]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_moe_combine_definition_and_blocks(dtype):
    for t, k, d, sh in [(5, 8, 33, True), (3, 1, 16, False), (0, 2, 8, True)]:
        y, order, w, shared = moe_inputs(t, k, d, dtype, seed=t + k, shared=sh)
        got = fused.moe_combine(y, order, w, shared)
        assert got.dtype == dtype and got.shape == (t, d)
        assert torch.equal(got, loop_combine(y, order, w, shared))
        # any block, rows past T zero (the padding), is bitwise the slice of the whole
        inv = fused.inverse_order(order).view(w.shape)
        for rows, cols in [((1, 4), (0, d)), ((2, t + 3), (3, d - 1)), ((t, t + 2), (0, d))]:
            out = torch.full((rows[1] - rows[0], cols[1] - cols[0]), 7.0, dtype=dtype)
            fused.moe_combine_block(out, y, inv, w, shared, rows, cols)
            want = F.pad(got, (0, 0, 0, rows[1] - t))[rows[0]:rows[1], cols[0]:cols[1]]
            assert torch.equal(out, want)


def test_experts_grouped_is_sorted_experts_then_the_combine():
    """kernels/moe/ref.experts_grouped's torch form is fused.moe_combine (choice order, not an
    index_add): bitwise; and close to the loop (bf16 GEMM roundings apart)."""
    from tpserve.kernels.moe import ref as moe

    e, d, i, k, t = 6, 64, 32, 3, 11
    g = torch.Generator().manual_seed(5)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    weights = torch.rand(t, k, generator=g)
    x = torch.randn(t, d, generator=g).bfloat16()
    gu = (torch.randn(e, 2 * i, d, generator=g) / d**0.5).bfloat16()
    dn = (torch.randn(e, d, i, generator=g) / i**0.5).bfloat16()
    y, order = moe.experts_sorted(x, weights, ids, gu, dn, 1.5)
    got = moe.experts_grouped(x, weights, ids, gu, dn, 1.5)
    assert torch.equal(got, fused.moe_combine(y, order, weights))
    want = moe.experts_loop(x.float(), weights, ids, gu.float(), dn.float(), 1.5)
    assert ((got.float() - want).abs().max() / want.abs().max()).item() < 2e-2
    from tpserve.kernels.choice import Kernels
    from tpserve.kernels.registry import resolve

    def takes(x, moe, max_tokens):  # the experts' table (kernels/quant/dispatch.py) picks grouped_mm
        return resolve(Kernels(moe=moe, moe_triton_max_tokens=max_tokens)).experts.kernel("bf16", x) == "grouped_mm"

    assert takes(x, "triton", 0) and not takes(x, "triton", t)
    assert not takes(x, "torch", 0) and not takes(x.float(), "triton", 0)


def test_world_one_and_the_argument_checks():
    comm = Communicator(None, torch.device("cpu"))
    y, order, w, shared = moe_inputs(5, 2, 8, torch.float32, seed=3)
    assert torch.equal(comm.reduce_scatter_moe_combine(y, order, w, shared),
                       fused.moe_combine(y, order, w, shared))
    cases = [((y, order, w[0], shared), "weights must be"),
             ((y, order, w[:, :0], shared), "weights must be"),
             ((y[:-1], order, w, shared), "y shape"),
             ((y[0], order, w, shared), "y shape"),
             ((y, order[:-1], w, shared), "order shape"),
             ((y, order.view(5, 2), w, shared), "order shape"),
             ((y, order, w, shared[:4]), "shared shape"),
             ((y, order, w, shared[:, :7]), "shared shape"),
             ((y.long(), order, w, None), "y must be a floating"),
             ((y, order, w.long(), shared), "weights must be a floating"),
             ((y, order.float(), w, shared), "order must be int64 or int32"),
             ((y, order, w, shared.double()), "shared dtype"),
             ((y, order.to("meta"), w, shared), "order is on meta"),
             ((y, order, w.to("meta"), shared), "weights is on meta"),
             ((y, order, w, shared.to("meta")), "shared is on meta")]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            comm.reduce_scatter_moe_combine(*args)
    with pytest.raises(ValueError, match="combine must be one of"):
        comm.reduce_scatter_moe_combine(y, order, w, shared, combine="cuda")


class RecordingComm:
    def __init__(self):
        self.world_size, self.calls = 2, []

    def reduce_scatter(self, x, dim=0):
        self.calls.append("reduce_scatter")
        return x

    def reduce_scatter_moe_combine(self, y, order, weights, shared, *, combine):
        self.calls.append(("reduce_scatter_moe_combine", combine))
        return fused.moe_combine(y, order, weights, shared, combine)


def test_decoder_layer_hands_the_sorted_output_to_the_fused_collective():
    from tpserve.model.glm5_next import DecoderLayer
    from tpserve.model.moe import SortedMoeOutput

    comm = RecordingComm()
    layer = SimpleNamespace(fused_expand=True, comm=comm)
    y, order, w, shared = moe_inputs(4, 2, 8, torch.float32, seed=1)
    parts = SortedMoeOutput(y, order, w, shared, "torch")
    sp = SimpleNamespace(sequence_parallel=True)
    got = DecoderLayer._reduce(layer, parts, sp)
    assert comm.calls == [("reduce_scatter_moe_combine", "torch")]
    assert torch.equal(got, fused.moe_combine(y, order, w, shared))
    DecoderLayer._reduce(layer, y[:4], sp)  # a plain partial: the plain reduce-scatter
    assert comm.calls[-1] == "reduce_scatter"


def test_moe_forward_unreduced_is_forward_before_its_combine(tiny):
    """Grouped bf16 experts: forward_unreduced's pieces combine to forward's output bit for bit;
    the loop (moe torch) and quantized experts hand back the combined tensor as before."""
    from tpserve.kernels.choice import Kernels
    from tpserve.model.build import build_model
    from tpserve.model.config import ModelConfig
    from tpserve.model.layers import ShardContext
    from tpserve.model.moe import MoE, SortedMoeOutput

    path = tiny("default")
    cfg = ModelConfig.from_file(path)
    x = torch.randn(9, cfg.hidden_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    for kernels, grouped in [(Kernels(moe="triton", moe_triton_max_tokens=0), True), (Kernels(), False)]:
        model = build_model(path, cfg, ShardContext.single(torch.bfloat16), torch.device("cpu"), kernels)
        moe = next(m for m in model.modules() if isinstance(m, MoE))
        with torch.inference_mode():
            want, got = moe(x), moe.forward_unreduced(x)
        assert isinstance(got, SortedMoeOutput) is grouped
        if grouped:
            assert got.combine == "torch" and got.shared is not None and got.y.shape[0] == 9 * got.weights.shape[1]
            got = fused.moe_combine(got.y, got.order, got.weights, got.shared, got.combine)
        assert torch.equal(got, want)
    moe.experts.quant = SimpleNamespace(name="fp8")  # quantized experts keep the combined output
    assert moe.experts.forward_sorted(x, *moe.gate(x)) is None


# -- the CPU workspace at world 2, 3, 4 ---------------------------------------------------------
def _cases(world: int):
    """(label, t, k, d, dtype, shared, layout); one spawn runs them all."""
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        for t, k, d in [(7, 8, 64), (1, 1, 16), (2 * world + 1, 2, 48), (61, 8, 64), (5, 2, 3000)]:
            for shared in (True, False):
                cases.append((f"{dtype} t={t} k={k} d={d} shared={shared}", t, k, d, dtype, shared,
                              "contiguous"))
        cases.append((f"{dtype} strided", 9, 4, 40, dtype, True, "strided"))
        cases.append((f"{dtype} empty", 0, 2, 16, dtype, True, "contiguous"))
    return cases


def _battery(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    comm = Communicator(dist.group.WORLD, torch.device("cpu"), timeout_s=60,
                        workspace_bytes=WORKSPACE_BYTES)
    ws = comm._ws
    calls = {"fused": 0}
    real = ws.reduce_scatter_moe_combine

    def counted(*args):
        calls["fused"] += 1
        return real(*args)

    ws.reduce_scatter_moe_combine = counted
    bad: dict[str, str] = {}
    rounds = 0
    for n, (label, t, k, d, dtype, with_shared, layout) in enumerate(_cases(world)):
        inputs = [moe_inputs(t, k, d, dtype, seed=100 * n + r, shared=with_shared) for r in range(world)]
        y, order, w, shared = inputs[rank]
        if layout == "strided":  # every input a non-contiguous view, order in int32
            y = torch.zeros(y.shape[0], 2 * d, dtype=dtype)[:, ::2].copy_(y)
            w = w.t().contiguous().t()
            shared = torch.zeros(t, d + 3, dtype=dtype)[:, 2:2 + d].copy_(shared)
            order = order.int()
        before = ws._round
        got = comm.reduce_scatter_moe_combine(y, order, w, shared)
        rounds = max(rounds, ws._round - before)
        # the unfused path through the same communicator, and the rank-order sum of every rank's
        # padded combine (computed here from every rank's inputs)
        pad = (-t) % world
        unfused = comm.reduce_scatter(F.pad(fused.moe_combine(y, order, w, shared), (0, 0, 0, pad)))
        combined = [F.pad(fused.moe_combine(*inp), (0, 0, 0, pad)) for inp in inputs]
        acc = combined[0].float()
        for c in combined[1:]:
            acc = acc + c.float()
        want = acc.to(dtype).chunk(world)[rank] if t else acc.to(dtype)
        for name, ref in (("unfused", unfused), ("rank-order sum", want)):
            if got.dtype != dtype or got.shape != ref.shape or not torch.equal(got, ref):
                bad[f"{label} vs {name}"] = f"got {tuple(got.shape)} {got.flatten()[:3]} want {ref.flatten()[:3]}"
    return {"bad": bad, "fused": calls["fused"], "cases": len(_cases(world)), "rounds": rounds,
            "cap": ws.capacity(torch.float32) // world}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_fused_equals_unfused_on_the_cpu_workspace(world):
    ranks = spawn_ranks(_battery, world, timeout=300)
    for rank, out in enumerate(ranks):
        assert not out["bad"], f"world {world} rank {rank}: {out['bad']}"
        assert out["fused"] == out["cases"]  # every case went through the workspace's fused path
        assert out["rounds"] > 3  # the larger cases took several pipelined rounds
        assert out["cap"] < 3000  # and a 3000-wide row was split across rounds


def _table_battery(rank: int, world: int, table_path: str) -> dict:
    """The fold where a size table says "unfused" up to 4 KiB: small calls take the combine then the
    reduce-scatter, larger ones the fused path, with the same results."""
    from tpserve.config import EngineConfig

    torch.set_num_threads(1)
    comm = Communicator(dist.group.WORLD, torch.device("cpu"), timeout_s=60, workspace_bytes=WORKSPACE_BYTES,
                        config=EngineConfig(collective_table=table_path))
    ws, calls, out = comm._ws, [], {}
    real = ws.reduce_scatter_moe_combine
    ws.reduce_scatter_moe_combine = lambda *a: calls.append(1) or real(*a)
    for t, d in ((3, 64), (40, 64)):  # the combined rows: 768 B and 10 KiB of float32
        y, order, w, shared = moe_inputs(t, 2, d, torch.float32, seed=rank)
        before = len(calls)
        got = comm.reduce_scatter_moe_combine(y, order, w, shared)
        want = comm.reduce_scatter(F.pad(fused.moe_combine(y, order, w, shared), (0, 0, 0, (-t) % world)))
        out[t] = [len(calls) - before, torch.equal(got, want)]
    return out


def test_a_size_table_can_turn_the_fold_off_by_size(tmp_path):
    from tpserve.collectives import tuning

    rule = tuning.Rule("reduce_scatter_moe_combine", "*", None, 4096, tuning.UNFUSED)
    table = tuning.SizeTable((rule, *tuning.default_table("cpu").rules))
    path = tuning.write_table(table, tmp_path / "table.json")
    for rank, out in enumerate(spawn_ranks(_table_battery, 2, str(path), timeout=120)):
        assert out == {3: [0, True], 40: [1, True]}, (rank, out)


# -- the model at TP=2 with sequence parallelism ------------------------------------------------
def test_fold_changes_no_token_at_tp2_with_sp(tiny, monkeypatch):
    """Grouped bf16 experts (moe triton with no token limit: on CPU torch's grouped_mm; set here
    past setup's cuda check, the Kernels travel to the worker as they are), SP prefills from 16
    tokens: --fused-collectives on (the combine inside the workspace reduce-scatter) and off
    (combine, pad, reduce-scatter) give bitwise the same logits and the same greedy tokens."""
    from helpers import prefill_logits, random_prompts
    from tpserve import LLM, SamplingParams
    from tpserve.engine import engine as engine_mod

    resolve = engine_mod.resolve_runtime

    def grouped_experts(ecfg):
        rt = resolve(ecfg)
        return dataclasses.replace(rt, kernels=dataclasses.replace(rt.kernels, moe="triton",
                                                                   moe_triton_max_tokens=0))

    monkeypatch.setattr(engine_mod, "resolve_runtime", grouped_experts)
    path = tiny("default")
    prompts = random_prompts((20, 33), seed=9)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    tokens, logits, folded = {}, {}, {}
    for on in (True, False):
        llm = LLM(str(path), device="cpu", dtype="bfloat16", kv_cache_memory="8MiB", block_size=16,
                  tensor_parallel_size=2, max_num_batched_tokens=64, sequence_parallel=True,
                  sp_min_tokens=16, fused_collectives=on)
        try:
            comm = llm.engine.executor.state.comm
            assert llm.engine.executor.state.runner.kernels.moe == "triton"
            ws, count = comm._ws, {"n": 0}
            real = ws.reduce_scatter_moe_combine

            def counted(*args, real=real, count=count):
                count["n"] += 1
                return real(*args)

            ws.reduce_scatter_moe_combine = counted
            outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
            tokens[on] = [o.outputs[0].token_ids for o in outs]
            logits[on] = prefill_logits(llm, prompts[1])
            folded[on] = count["n"]
        finally:
            llm.shutdown()
    assert folded[False] == 0 and folded[True] > 0  # the fold really served the SP prefills
    assert tokens[True] == tokens[False]
    assert torch.equal(logits[True], logits[False])
