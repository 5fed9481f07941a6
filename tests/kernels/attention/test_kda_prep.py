"""KDA prep kernels (kernels/attention/kda_prep_triton.py, run by Triton's CPU interpreter) against the torch forms
of kernels/attention/conv.py and model/kda.py; and the invariant speculative decoding needs: a verify row equals
the decode step it stands for, bit for bit.

Bounds: the short conv is k products and k - 1 adds in fp32 (the compiler may fuse a product and an add,
and exp may round differently from torch's): at most 8 k fp32 ulps of sum |x w| + |y| apart before
the output's own rounding, which may then move one ulp of the output dtype. The gate is exp, a
product, a sigmoid and a scale: its argument z carries a few ulps, which the sigmoid passes on times
|z| (8 ulps of |g| (1 + |z|)); beta is one sigmoid then the output rounding."""

from interpreted import run_interpreted


def test_conv_rows_and_gates_against_torch_forms():
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.attention import conv
        from tpserve.kernels.attention.kda_prep_triton import conv_rows, gate_beta
        eps32 = torch.finfo(torch.float32).eps
        res = {}

        def excess(got, want, scale, dtype, kw):
            if got.shape != want.shape or got.dtype != want.dtype:
                return 1e9
            bound = 8 * kw * eps32 * scale + torch.finfo(dtype).eps * want.double().abs() + 2.0**-24
            return float(((got.double() - want.double()).abs() - bound).max())

        for b, part, kw, dtype in [(3, 40, 4, torch.float32), (2, 700, 4, torch.float16), (1, 8, 2, torch.float32),
                                   (4, 24, 3, torch.float16)]:
            c = 3 * part
            g = torch.Generator().manual_seed(b * part)
            pool = torch.randn(6, c, kw - 1, generator=g).to(dtype)
            weight = torch.randn(c, kw, generator=g) / kw**0.5
            slots = torch.tensor([5, 0, 3, 2][:b])
            name = f"{b}x{c} k{kw} {dtype}"
            # decode: one row per sequence, states advance in place
            x = torch.randn(b, c, generator=g).to(dtype)
            want, want_state = conv.causal_conv_step(x, pool[slots], weight)
            scale = (torch.cat([pool[slots].float(), x.float().unsqueeze(-1)], -1).abs() * weight.abs()).sum(-1)
            after = pool.clone()
            q, k, v = conv_rows(x, after, slots, weight, 1, True)
            got = torch.cat([q, k, v], dim=-1)
            res[name + " decode"] = excess(got, want, scale, dtype, kw)
            others = [s for s in range(6) if s not in slots.tolist()]
            res[name + " state"] = bool(torch.equal(after[slots], want_state.to(dtype))
                                        and torch.equal(after[others], pool[others]))
            res[name + " contiguous"] = all(t.is_contiguous() for t in (q, k, v))
            # verify: n rows per sequence, states read only; against the torch verify form
            n = 4
            rows = torch.randn(b * n, c, generator=g).to(dtype)
            want = conv.causal_conv_verify_uniform(rows.view(b, n, c), pool[slots], weight).reshape(b * n, c)
            frozen = pool.clone()
            got = torch.cat(conv_rows(rows, frozen, slots, weight, n, False), dim=-1)
            scale = rows.float().abs().amax() * weight.abs().sum(-1) + pool.float().abs().amax() * weight.abs().sum(-1)
            res[name + " verify"] = excess(got, want, scale.expand_as(want), dtype, kw)
            res[name + " verify keeps states"] = bool(torch.equal(frozen, pool))
            # the invariant: each verify row is the decode step it stands for, bit for bit
            stepped, outs = pool.clone(), []
            for j in range(n):
                outs.append(torch.cat(conv_rows(rows.view(b, n, c)[:, j].contiguous(), stepped, slots, weight, 1, True),
                                      dim=-1))
            res[name + " verify == decode steps"] = bool(torch.equal(torch.stack(outs, 1).reshape(b * n, c), got))
            # out=: rows written into a wider [T, C] buffer in place
            buf = torch.zeros(b * n, c, dtype=dtype)
            conv_rows(rows, pool.clone(), slots, weight, n, False, out=buf)
            res[name + " out="] = bool(torch.equal(buf, got))

        for t, h, dh, lower in [(3, 4, 16, -5.0), (2, 3, 40, -2.0)]:
            g = torch.Generator().manual_seed(t * h)
            f = (3 * torch.randn(t, h * dh, generator=g)).to(torch.float16)
            dt_bias, a_log = torch.randn(h * dh, generator=g), torch.randn(h, generator=g)
            b = (2 * torch.randn(t, h, generator=g)).to(torch.float16)
            gg, beta = gate_beta(f, dt_bias, a_log, b, dh, lower)
            raw = (f.float() + dt_bias).view(t, h, dh)
            z = a_log.exp().view(1, -1, 1) * raw
            want_g = lower * torch.sigmoid(z)
            want_b = torch.sigmoid(b)
            # z carries ~4 ulps (exp, product, sum), which sigmoid passes on relative to (1 - s) |z| <= |z|
            bound = 8 * eps32 * want_g.abs() * (1 + z.abs())
            res[f"gate {t}x{h}x{dh}"] = float(((gg - want_g).abs() - bound).max())
            res[f"beta {t}x{h}"] = excess(beta, want_b, torch.zeros_like(want_b.float()), torch.float16, 1)
            res[f"gate dtypes {t}"] = [str(gg.dtype), str(beta.dtype), list(gg.shape) == [t, h, dh]]
        print(json.dumps(res))
    """)
    for name, r in out.items():
        if name.startswith("gate dtypes"):
            assert r == ["torch.float32", "torch.float16", True], name
        elif isinstance(r, bool):
            assert r, name
        else:
            assert r <= 0, (name, r)


def test_conv_chunk_against_the_torch_prefill_conv():
    """Prefill chunks (kernels/attention/kda_prep_triton.conv_chunk) against kernels/attention/conv.causal_conv_seq: outputs within
    the conv's bound (above), the new state equal; chunks shorter than the state, odd widths, a strided x."""
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.attention import conv
        from tpserve.kernels.attention.kda_prep_triton import conv_chunk
        eps32 = torch.finfo(torch.float32).eps
        res = {}
        for n, c, kw, dtype in [(1, 24, 4, torch.float32), (2, 24, 4, torch.float16), (3, 150, 4, torch.float32),
                                (40, 72, 4, torch.float16), (77, 33, 3, torch.float32), (65, 9, 2, torch.float16)]:
            g = torch.Generator().manual_seed(n * c)
            wide = torch.randn(n, c + 5, generator=g).to(dtype)
            x = wide[:, 2:2 + c]  # rows strided
            state = torch.randn(c, kw - 1, generator=g).to(dtype)
            weight = torch.randn(c, kw, generator=g) / kw**0.5
            want, want_state = conv.causal_conv_seq(x, state, weight)
            buf = torch.full((n, c), float("nan"), dtype=dtype)
            got, new_state = conv_chunk(x, state, weight, out=buf)
            full = torch.cat([state.float(), x.float().t()], -1).abs()
            scale = torch.stack([(full[:, r:r + kw] * weight.abs()).sum(-1) for r in range(n)])
            bound = 8 * kw * eps32 * scale + torch.finfo(dtype).eps * want.double().abs() + 2.0**-24
            name = f"{n}x{c} k{kw} {dtype}"
            res[name] = float(((got.double() - want.double()).abs() - bound).max())
            res[name + " in out"] = got.data_ptr() == buf.data_ptr()
            res[name + " state"] = bool(torch.equal(new_state, want_state.to(dtype)))
        print(json.dumps(res))
    """)
    for name, r in out.items():
        if isinstance(r, bool):
            assert r, name
        else:
            assert r <= 0, (name, r)


def test_conv_rows_refuses_what_it_cannot_do():
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.attention.kda_prep_triton import conv_rows, gate_beta
        res = {}
        x, pool, w, slots = torch.zeros(4, 12), torch.zeros(3, 12, 3), torch.zeros(12, 4), torch.tensor([0, 1])
        for name, call in [("update with n > 1", lambda: conv_rows(x, pool, slots, w, 2, True)),
                           ("strided pool", lambda: conv_rows(x, pool.transpose(1, 2), slots, w, 2, False)),
                           ("no lower bound", lambda: gate_beta(x, torch.zeros(12), torch.zeros(3), x[:, :3], 4, None))]:
            try:
                call()
                res[name] = "no error"
            except ValueError as e:
                res[name] = str(e)
        print(json.dumps(res))
    """)
    assert "one row per sequence" in out["update with n > 1"]
    assert "contiguous state pool" in out["strided pool"]
    assert "lower bound" in out["no lower bound"]


def test_engine_with_small_op_kernels_keeps_tokens_and_speculative_exactness(tiny):
    """A tiny checkpoint with an MTP layer (tests/helpers.py "mtp") on the CPU in float32 with the KDA prep,
    SwiGLU, indexer pool, sparse MLA and drafter argmax kernels interpreted:
    greedy tokens equal to the torch forms, mixed steps (prefill chunks beside decodes) included, and
    with MTP drafts (verify rows through the same conv kernel) equal to plain decoding."""
    out = run_interpreted("""
        import json
        import tpserve.engine.setup as setup
        from tpserve import LLM, SamplingParams
        from tpserve.tools.acceptance import mtp_prompts
        plain = setup._triton_or_torch
        interpreted = ("kda_prep_backend", "act_backend", "indexer_backend", "mla_decode_backend", "argmax_backend")
        setup._triton_or_torch = lambda name, choice, device: (
            choice if name in interpreted and choice == "triton" else plain(name, choice, device))
        on = {name: "triton" for name in interpreted}
        off = {name: "torch" for name in interpreted}
        prompts = mtp_prompts()[:3]
        sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        runs = {}
        for name, kw in [("torch", off), ("triton", on), ("triton+mtp", dict(on, speculative_config={
                             "method": "mtp", "num_speculative_tokens": 3, "adaptive": False}))]:
            llm = LLM("@MODEL@", device="cpu", dtype="float32", max_num_batched_tokens=32, kv_cache_memory=2**28, **kw)
            runs[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
            model = llm.engine.executor.runner.model
            mla = model.layers[llm.engine.model_config.mla_layers[0]].self_attn
            prep = bool(model.layers[0].self_attn.conv_rows) and mla.indexer.fused_pools and bool(mla.sparse_mla)
            llm.shutdown()
            runs[name + " prep"] = prep
        print(json.dumps(runs))
    """.replace("@MODEL@", str(tiny("mtp"))))
    assert out["torch prep"] is False and out["triton prep"] is True
    assert out["triton"] == out["torch"]
    assert out["triton+mtp"] == out["triton"]
