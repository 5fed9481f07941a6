"""MoE routing and the expert-sorted layout in Triton (kernels/moe/route_triton.py, run by Triton's CPU
interpreter) against the torch forms: moe/route.py (the Router's torch reference) and moe/align.py."""

import torch
from interpreted import run_interpreted

from tpserve.kernels.choice import Kernels
from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext
from tpserve.model.moe import Router
from tpserve.model.tiny import tiny_config_dict


def test_router_kernel_equals_torch_router():
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.choice import Kernels
        from tpserve.model.config import ModelConfig
        from tpserve.model.layers import ShardContext
        from tpserve.model.moe import Router
        from tpserve.model.tiny import tiny_config_dict
        eps32 = torch.finfo(torch.float32).eps
        out = {}
        for t, e, k, norm, scaling in [(1, 288, 8, True, 2.5), (5, 288, 8, True, 2.5), (7, 6, 2, False, 1.0),
                                       (3, 64, 1, True, 1.0), (0, 16, 4, True, 2.0)]:
            over = dict(n_routed_experts=e, num_experts_per_tok=k, norm_topk_prob=norm, routed_scaling_factor=scaling,
                        n_group=1, topk_group=1)
            cfg = ModelConfig.from_dict(tiny_config_dict(**over))
            g = torch.Generator().manual_seed(t * 1000 + e)
            fused = Router(ShardContext.single(torch.float32, kernels=Kernels(moe_route="triton")), cfg)
            ref = Router(ShardContext.single(torch.float32), cfg)
            w = torch.randn(e, cfg.hidden_size, generator=g) / cfg.hidden_size**0.5
            b = 0.1 * torch.randn(e, generator=g)
            for r in (fused, ref):
                r.weight = torch.nn.Parameter(w.clone(), requires_grad=False)
                r.e_score_correction_bias = torch.nn.Parameter(b.clone(), requires_grad=False)
            x = torch.randn(t, cfg.hidden_size, generator=g)
            assert fused.route.backend == "triton" and ref.route.backend == "torch"
            wf, idf = fused(x)
            wr, idr = ref(x)
            # the k choices come in another order: compare sorted by expert id
            sf, of = idf.sort(dim=-1)
            sr, orr = idr.sort(dim=-1)
            wf, wr = wf.gather(1, of), wr.gather(1, orr)
            # sigmoid, a k-term sum and a division: a few fp32 roundings on each side
            bound = 16 * eps32 * wr.abs()
            out[f"{t},{e},{k}"] = {"ids": bool(torch.equal(sf, sr)), "dtype": [str(wf.dtype), str(idf.dtype)],
                                   "shape": list(wf.shape) == [t, k],
                                   "excess": float(((wf - wr).abs() - bound).max()) if t else 0.0}
        print(json.dumps(out))
    """)
    for case, r in out.items():
        assert r["ids"] and r["shape"], case
        assert r["dtype"] == ["torch.float32", "torch.int64"], case
        assert r["excess"] <= 0, (case, r)


def test_align_kernel_equals_torch_layout():
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.moe import align as moe_align
        from tpserve.kernels.moe.route_triton import align_by_expert_triton
        out = {}
        g = torch.Generator().manual_seed(0)
        cases = [(1, 8, 288, 16), (7, 3, 5, 4), (40, 2, 9, 16), (64, 8, 32, 16), (3, 4, 4, 1), (300, 8, 288, 16)]
        for t, k, e, block in cases:
            ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
            out[f"{t},{k},{e},{block}"] = ids
        out["skew"] = (torch.zeros(50, 1, dtype=torch.long) + 3, 7, 4)  # one expert, several blocks
        res = {}
        for name, spec in out.items():
            if isinstance(spec, tuple):
                ids, e, block = spec
            else:
                ids, (e, block) = spec, tuple(int(v) for v in name.split(",")[2:])
            want_rows, want_be = moe_align.align_by_expert(ids, e, block)
            rows, be = align_by_expert_triton(ids, e, block)
            same_runs = True
            for b0 in range(be.numel()):  # the same rows in each block's run, any order inside a run
                if b0 and be[b0] == be[b0 - 1] and be[b0] < e:
                    continue
                b1 = b0
                while b1 + 1 < be.numel() and be[b1 + 1] == be[b0] and be[b0] < e:
                    b1 += 1
                got = rows[b0 * block:(b1 + 1) * block]
                want = want_rows[b0 * block:(b1 + 1) * block]
                same_runs &= torch.equal(got.sort().values, want.sort().values)
            res[name] = {"block_expert": torch.equal(be, want_be), "runs": bool(same_runs),
                         "dtypes": [str(rows.dtype), str(be.dtype)]}
        print(json.dumps(res))
    """)
    for case, r in out.items():
        assert r == {"block_expert": True, "runs": True, "dtypes": ["torch.int32", "torch.int32"]}, case


def test_experts_same_output_with_either_layout():
    """Rows inside an expert's run come in another order with the triton layout: each row is computed
    alone, so the grouped kernels' output is bitwise the same."""
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.moe import grouped_triton as moe_triton
        from tpserve.kernels.moe import route_triton
        from tpserve.kernels.moe.grouped_triton import experts_triton
        # the layout only: both sides sum the k choices the torch way (combine_choices has its own test)
        moe_triton.combine_choices = lambda y, k, dtype, backend: route_triton.combine_choices(y, k, dtype, "torch")
        out = {}
        for t, k, e, d, i in [(1, 2, 6, 48, 24), (20, 4, 9, 80, 40)]:
            g = torch.Generator().manual_seed(t)
            ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
            weights = torch.rand(t, k, generator=g)
            gate_up = torch.randn(e, 2 * i, d, generator=g) / d**0.5
            down = torch.randn(e, d, i, generator=g) / i**0.5
            x = torch.randn(t, d, generator=g)
            a = experts_triton(x, weights, ids, gate_up, down, 1.5, block_n=16, block_k=16, route_backend="torch")
            b = experts_triton(x, weights, ids, gate_up, down, 1.5, block_n=16, block_k=16, route_backend="triton")
            out[f"{t}"] = bool(torch.equal(a, b))
        print(json.dumps(out))
    """)
    assert all(out.values()), out


def test_router_keeps_torch_for_group_limited_routing():
    over = dict(n_routed_experts=16, num_experts_per_tok=2, n_group=4, topk_group=2)
    cfg = ModelConfig.from_dict(tiny_config_dict(**over))
    ctx = ShardContext.single(torch.float32, kernels=Kernels(moe_route="triton"))
    assert Router(ctx, cfg).route.backend == "torch"
    assert Router(ctx, ModelConfig.from_dict(tiny_config_dict())).route.backend == "triton"


def test_combine_choices_against_torch_sum():
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.moe.route_triton import combine_choices
        eps32 = torch.finfo(torch.float32).eps
        res = {}
        for t, k, d, dtype in [(1, 8, 300, torch.float16), (5, 3, 1030, torch.float32), (0, 2, 8, torch.float16)]:
            y = torch.randn(t * k, d, generator=torch.Generator().manual_seed(d))
            got = combine_choices(y, k, dtype, "triton")
            want = combine_choices(y, k, dtype, "torch")
            # k fp32 adds in another order, then one rounding to dtype (one ulp of it may move)
            scale = y.view(t, k, d).abs().sum(1).double()
            bound = k * eps32 * scale + torch.finfo(dtype).eps * want.double().abs() + 2.0**-24
            res[f"{t}x{k}x{d}"] = [got.dtype == want.dtype and got.shape == want.shape,
                                   float(((got.double() - want.double()).abs() - bound).max()) if t else 0.0]
        print(json.dumps(res))
    """)
    for name, (same, excess) in out.items():
        assert same and excess <= 0, (name, excess)


def test_combine_sorted_against_index_add():
    """The grouped MoE's combine (outputs in expert order, weights per token) against experts_grouped's torch
    form: index_add of the fp32 weighted outputs."""
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.moe.route_triton import combine_sorted
        eps32 = torch.finfo(torch.float32).eps
        res = {}
        for t, k, d, dtype in [(1, 8, 300, torch.float16), (6, 3, 1030, torch.float32), (9, 2, 8, torch.float16)]:
            g = torch.Generator().manual_seed(d)
            y = torch.randn(t * k, d, generator=g).to(dtype)
            order = torch.randperm(t * k, generator=g)
            w = torch.rand(t, k, generator=g)
            got = combine_sorted(y, order, w)
            yw = y.float() * w.reshape(-1)[order, None]
            want = torch.zeros(t, d).index_add_(0, order // k, yw).to(dtype)
            scale = torch.zeros(t, d).index_add_(0, order // k, yw.abs()).double()
            bound = k * eps32 * scale + torch.finfo(dtype).eps * want.double().abs() + 2.0**-24
            res[f"{t}x{k}x{d}"] = [got.dtype == want.dtype and got.shape == want.shape,
                                   float(((got.double() - want.double()).abs() - bound).max())]
        print(json.dumps(res))
    """)
    for name, (same, excess) in out.items():
        assert same and excess <= 0, (name, excess)
