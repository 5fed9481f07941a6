"""The mHC projection of prefill steps in one kernel (kernels/norms/hc_project_triton.py, Triton's CPU interpreter, in
float32: the interpreter has no bf16 arithmetic) against float64, with the torch form (normalise in fp32, then an
fp32 linear) under the same bound; the bf16 split of its weight (kernels/norms/mhc.py split_weight, plain torch: runs
everywhere); the bf16 kernel against float64 on a GPU: bench/prefill_kernels.py.

Bound per output (u = 2^-24, S = r sum_c |x_c fn_jc|, K columns): the split <= u S, 3K exact products summed in
fp32 <= 3K u S, r moved by <= (K/2 + 3) u relative by the mean of squares, the last product u |m|.
"""

import torch

from interpreted import run_interpreted
from tpserve.kernels.norms.mhc import project_weight, split_weight


def test_split_weight_sums_back_to_the_weight():
    g = torch.Generator().manual_seed(3)
    fn = torch.randn(24, 1000, generator=g) * torch.logspace(-6, 2, 1000)  # a wide range of magnitudes
    fn[0, :5] = torch.tensor([0.0, 1.0, -3.0e-30, 2.0 ** -126, 65504.0])
    parts = split_weight(fn)
    assert parts.shape == (3, 24, 1000) and parts.dtype == torch.bfloat16
    back = parts.double().sum(0)
    assert ((back - fn.double()).abs() <= 2.0 ** -24 * fn.double().abs()).all()
    assert (parts[0].float() == fn.to(torch.bfloat16).float()).all()  # hi is the plain rounding
    assert project_weight(fn, torch.float32).shape == (1, 24, 1000)


def test_kernel_and_torch_form_against_float64():
    out = run_interpreted("""
        import json, torch
        import torch.nn.functional as F
        from tpserve.kernels.norms.hc_project_triton import hc_project
        from tpserve.kernels.norms.mhc import project_weight
        g = torch.Generator().manual_seed(0)
        t, k, w, eps = 37, 320, 24, 1e-6                      # K not a whole number of steps, T of programs
        rows = (torch.randn(t, k + 64, generator=g) * 3)[:, :k]   # strided rows
        rows[5] = 0                                            # an all-zero row: r = 1 / sqrt(eps), output 0
        fn = torch.randn(w, k, generator=g) * 0.02
        got = hc_project(rows, project_weight(fn, torch.float32), eps)
        try:
            hc_project(rows, project_weight(fn, torch.bfloat16), eps)
            refused = False
        except ValueError:
            refused = True
        x = rows.double()
        r = 1 / torch.sqrt(x.square().mean(-1, keepdim=True) + eps)
        ref = r * (x @ fn.double().T)
        flat = rows.float() * torch.rsqrt(rows.float().square().mean(-1, keepdim=True) + eps)
        torch_form = F.linear(flat, fn)
        u = 2.0 ** -24
        s = r * (x.abs() @ fn.double().abs().T)
        bound = s * (u + 3 * k * u) + ref.abs() * ((k / 2 + 3) * u + u)
        print(json.dumps({
            "shape": list(got.shape), "dtype": str(got.dtype),
            "kernel_excess": float(((got.double() - ref).abs() - bound).max()),
            "torch_excess": float(((torch_form.double() - ref).abs() - bound).max()),
            "kernel_err": float((got.double() - ref).abs().max()),
            "zero_row": bool((got[5] == 0).all()),
            "refused": refused,
        }))
    """)
    assert out["shape"] == [37, 24] and out["dtype"] == "torch.float32"
    assert out["zero_row"] and out["refused"], out  # (fp32 streams with the bf16 split: a clear error)
    assert out["torch_excess"] <= 0, out  # the bound holds for the reference form too
    assert out["kernel_excess"] <= 0, out


def test_model_prefill_through_the_kernel_gives_the_same_tokens(tiny):
    """The model's wiring (model/mhc.py: steps with prefill tokens only, streams flattened per token): the tiny
    checkpoint in float32 with every block's projection weight set for the kernel (prepare_runtime sets it for
    bf16 models on cuda only) gives the greedy tokens of the plain path; decode steps keep the plain path."""
    out = run_interpreted(f"""
        import json, torch
        from tpserve import LLM, SamplingParams
        from tpserve.kernels.norms.mhc import project_weight
        from tpserve.model.mhc import HyperConnection
        llm = LLM({str(tiny("default"))!r}, device="cpu", kv_cache_memory="8MiB", block_size=16, max_num_seqs=2)
        prompts = [[5, 9, 33, 2, 71, 8, 100, 3], [44, 2, 9, 1, 17]]
        sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        plain = llm.generate([{{"prompt_token_ids": p}} for p in prompts], sp)
        hcs = [m for m in llm.engine.executor.runner.model.modules() if isinstance(m, HyperConnection)]
        for m in hcs:
            m.project_parts = project_weight(m.fn, torch.float32)
        calls = []
        import tpserve.kernels.norms.hc_project_triton as k
        real = k.hc_project
        k.hc_project = lambda *a: calls.append(a[0].shape[0]) or real(*a)
        fused = llm.generate([{{"prompt_token_ids": p}} for p in prompts], sp)
        llm.shutdown()
        print(json.dumps({{
            "blocks": len(hcs), "calls": len(calls), "rows": sorted(set(calls)),
            "tokens_equal": [a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(plain, fused)],
        }}))
    """)
    assert out["tokens_equal"] == [True, True], out
    assert out["blocks"] > 0 and out["calls"] > 0 and out["calls"] % out["blocks"] == 0, out
    assert max(out["rows"]) > 2, out  # prefill steps (the prompts' rows), not only one-row decode steps
