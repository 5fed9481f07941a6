"""The step model: decodes in mixed steps take the decode path, decode-step logits match
transformers, padded fixed-shape decode steps (what CUDA graphs replay) give identical tokens."""

import pytest
import torch

from helpers import FP32_EPS, random_prompts, reference_logits
from tpserve import LLM, SamplingParams

NEW = 10


def _llm(path, **kw):
    return LLM(str(path), device="cpu", kv_cache_memory="8MiB", block_size=16, skip_tokenizer_init=True, **kw)


def _record_plans(llm):
    plans = []
    execute = llm.engine.executor.execute

    def spy(plan, *prev):
        plans.append(plan)
        return execute(plan, *prev)

    llm.engine.executor.execute = spy
    return plans


def _run_staggered(llm, prompts, params):
    """Add one request per step, so prefill chunks of new requests share steps with decodes."""
    engine, outs = llm.engine, {}
    pending = list(enumerate(prompts))
    while pending or engine.has_unfinished():
        if pending:
            i, p = pending.pop(0)
            engine.add_request(str(i), p, params)
        for out in engine.step():
            if out.finished:
                outs[int(out.request_id)] = out
    return [outs[i] for i in range(len(prompts))]


@pytest.mark.parametrize("name", ["default", "shared"])
def test_mixed_steps_decode_logits_match_transformers(tiny, name):
    path = tiny(name)
    prompts = random_prompts((30, 75, 9, 52), seed=21)
    llm = _llm(path, max_num_batched_tokens=24)
    plans = _record_plans(llm)
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=3)
    outs = _run_staggered(llm, prompts, params)
    mixed = [p for p in plans if 0 < p.num_decode < len(p.slots)]
    assert mixed, "no step mixed decodes with prefill chunks"
    for prompt, out in zip(prompts, outs):
        tokens = out.outputs[0].token_ids
        # the logprobs of every decode step against the full-sequence forward of transformers:
        # log_softmax moves by at most 2x the largest logit error, bounded as in assert_logits_match_oracle
        seq = prompt + tokens[:-1]
        ref32 = reference_logits(path, seq)[len(prompt) - 1:].double().log_softmax(-1)
        ref64 = reference_logits(path, seq, torch.float64)[len(prompt) - 1:].log_softmax(-1)
        # each token transformers' greedy choice after the ones before it: its greedy decoding, step by step
        assert tokens == ref32.argmax(-1).tolist()
        bound = 2 * (8 * (ref32 - ref64).abs().max().item() + 64 * FP32_EPS / 2 * ref64.abs().max().item())
        worst = max(abs(lp.logprob - ref64[i, tok].item())
                    for i, step in enumerate(out.outputs[0].logprobs) for tok, lp in step.items())
        assert worst <= bound, f"decode logprob off by {worst:.2e} > {bound:.2e}"
    e = llm.engine
    assert e.block_pool.num_free == e.block_pool.num_blocks and e.slot_pool.num_free == e.slot_pool.num_blocks


def test_decodes_come_first_and_take_the_decode_path(tiny):
    # (without prefix caching: it ends prefill chunks where it keeps checkpoints, which can leave one-row chunks)
    llm = _llm(tiny("default"), max_num_batched_tokens=16, enable_prefix_caching=False)
    plans = _record_plans(llm)
    _run_staggered(llm, random_prompts((40, 5, 33), seed=2), SamplingParams(max_tokens=4, ignore_eos=True))
    for plan in plans:
        lens = [b - a for a, b in zip(plan.cu_seqlens, plan.cu_seqlens[1:])]
        assert plan.num_decode == sum(1 for n in lens if n == 1)
        assert all(n == 1 for n in lens[:plan.num_decode]) and all(n > 1 for n in lens[plan.num_decode:])


@pytest.mark.parametrize("name", ["default", "variant"])
def test_padded_fixed_shape_decode_gives_identical_tokens(tiny, name):
    """The CUDA-graph step (persistent buffers, padded batch, fixed-width block tables, dummy slot
    and block for padding rows) run eagerly on CPU: tokens identical to the plain path."""
    path = tiny(name)
    prompts = [{"prompt_token_ids": p} for p in random_prompts((12, 40, 3, 27, 61), seed=9)]
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    plain = _llm(path, max_num_seqs=6)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params)]
    padded = _llm(path, max_num_seqs=6)
    runner = padded.engine.executor.runner
    runner.setup_graphs(6, None, enforce_eager=False, pad_on_cpu=True)
    assert runner.graphs.buckets == [1, 2, 4, 6]
    plans = _record_plans(padded)
    got = [o.outputs[0].token_ids for o in padded.generate(prompts, params)]
    assert got == want
    assert any(p.is_uniform_decode and len(p.slots) in (3, 5) for p in plans), "no padded bucket was used"
    e = padded.engine
    assert e.block_pool.num_free == e.block_pool.num_blocks and e.slot_pool.num_free == e.slot_pool.num_blocks


def test_graph_buckets():
    from tpserve.engine.graphs import buckets

    assert buckets(1) == [1]
    assert buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert buckets(100) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 100]


@pytest.mark.parametrize("name", ["default", "variant"])
def test_sparse_prefill_equals_dense(tiny, name):
    """--mla-prefill sparse (each query over its selected rows, latent space) against the dense
    masked SDPA: same greedy tokens; prefill logits both within the fp32 bound of the oracle."""
    from helpers import assert_logits_match_oracle, prefill_logits

    path = tiny(name)
    prompts = [{"prompt_token_ids": p} for p in random_prompts((90, 33, 61), seed=4)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    runs = {}
    for mode in ("dense", "sparse"):
        llm = _llm(path, mla_prefill=mode, max_num_batched_tokens=48)
        runs[mode] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        assert_logits_match_oracle(prefill_logits(llm, prompts[0]["prompt_token_ids"]), path,
                                   prompts[0]["prompt_token_ids"])
    assert runs["sparse"] == runs["dense"]


def test_fill_writes_the_whole_step_whatever_was_filled_before(tiny):
    """StepGraphs._fill (the host twin of a graph step's inputs) against the layout written from scratch,
    through a run of fills: more than 8 sequences (the array path), a table that gained a block, another
    bucket's layout in between (it overlaps these host rows), and back. Block-table rows are rewritten only
    when they changed since the last fill of the same layout: a stale row would send a cache write to
    another sequence's block."""
    import numpy as np

    from tpserve.engine.runner import StepPlan

    llm = _llm(tiny(), max_num_seqs=16)
    runner = llm.engine.executor.runner
    runner.setup_graphs(16, None, enforce_eager=False, pad_on_cpu=True)
    g = runner.graphs
    bs = g.block_size

    def plan(n, shift=0, grown=()):
        tables = [[100 + 10 * i + j for j in range(1 + i % 3 + (i in grown))] for i in range(n)]
        pos = [len(t) * bs - 1 - (i + shift) % bs for i, t in enumerate(tables)]
        return StepPlan([7 + i for i in range(n)], pos, list(range(n + 1)), pos, [30 + i for i in range(n)], tables,
                        list(range(n)), [], False, n)

    def check(p, b):
        ids, pos, rows, owner, slots, tables, *_ = g._views(g.host_np, b, 1)
        n = len(p.slots)
        assert ids[:n].tolist() == p.input_ids and not ids[n:].any()
        assert pos[:n].tolist() == p.positions and not pos[n:].any()
        assert owner.tolist() == list(range(n)) + [b] * (b - n)
        assert slots.tolist() == p.slots + [g.dummy_slot] * (b - n)
        want = np.full((b + 1, g.max_blocks), g.dummy_block)
        for i, t in enumerate(p.block_tables):
            want[i, :len(t)] = t
        assert np.array_equal(tables, want)
        assert rows.tolist() == [t[q // bs] * bs + q % bs for t, q in zip(p.block_tables, p.positions)] + \
            [g.dummy_block * bs] * (b - n)

    steps = [(plan(12), 16), (plan(12, shift=1, grown=(4, 9)), 16), (plan(5), 8), (plan(12, shift=2), 16),
             (plan(3), 4), (plan(16, grown=(0,)), 16), (plan(12), 16)]
    for p, b in steps:
        g._fill(p, b, 1)
        check(p, b)


def test_fill_writes_verify_steps_whatever_was_filled_before(tiny):
    """StepGraphs._fill for verify steps (q rows per sequence, fewer for some: padding rows after them) against
    the layout written from scratch: one and two sequences (a loop), more (array expressions), a decode fill
    of another layout in between. Real rows map to sequence i's rows from i * q; every padding row is the
    dummy block's, owned by the dummy row."""
    import numpy as np

    from tpserve.engine.runner import StepPlan

    from tpserve import LLM

    llm = LLM(str(tiny("mtp")), device="cpu", max_num_seqs=8, kv_cache_memory="64MiB", block_size=16,
              skip_tokenizer_init=True,
              speculative_config={"method": "mtp", "num_speculative_tokens": 3, "adaptive": False})
    runner = llm.engine.executor.runner
    runner.setup_graphs(8, None, enforce_eager=False, pad_on_cpu=True, num_speculative_tokens=3)
    g = runner.graphs
    bs, q = g.block_size, 4

    def plan(lengths, shift=0):
        tables = [[50 + 10 * i + j for j in range(2 + i % 2)] for i in range(len(lengths))]
        cu = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        pos = [len(t) * bs - q - (i + shift) % 3 + j for i, (t, n) in enumerate(zip(tables, lengths)) for j in range(n)]
        ids = [300 + r for r in range(cu[-1])]
        return StepPlan(ids, pos, cu, [pos[c] for c in cu[:-1]], [20 + i for i in range(len(lengths))], tables,
                        list(range(cu[-1])), [], False, len(lengths))

    def check(p, b):
        ids, pos, rows, owner, slots, tables, lrows, real, _ = g._views(g.host_np, b, q)
        want = {"ids": [0] * b * q, "pos": [0] * b * q, "rows": [g.dummy_block * bs] * b * q, "owner": [b] * b * q}
        want_real = []
        for i, t in enumerate(p.block_tables):
            for j, r in enumerate(range(p.cu_seqlens[i], p.cu_seqlens[i + 1])):
                at = i * q + j
                want["ids"][at], want["pos"][at], want["owner"][at] = p.input_ids[r], p.positions[r], i
                want["rows"][at] = t[p.positions[r] // bs] * bs + p.positions[r] % bs
                want_real.append(at)
        assert (ids.tolist(), pos.tolist(), rows.tolist(), owner.tolist()) == \
            (want["ids"], want["pos"], want["rows"], want["owner"])
        assert slots.tolist() == p.slots + [g.dummy_slot] * (b - len(p.slots))
        assert real[:len(want_real)].tolist() == want_real
        assert lrows[:len(want_real)].tolist() == want_real  # every row's logits (logits_indices: all rows)

    decode = StepPlan([7], [40], [0, 1], [40], [3], [[90, 91, 92]], [0], [], False, 1)
    for lengths, b in [([4], 1), ([2, 4], 2), ([4, 1, 3], 4), ([4, 4, 2, 4, 3], 8), ([1, 4, 4], 4), ([3], 1)]:
        for shift in (0, 1):
            g._fill(plan(lengths, shift), b, q)
            check(plan(lengths, shift), b)
        g._fill(decode, 2, 1)


def test_auto_prefill_mixes_the_paths_by_length(tiny, monkeypatch):
    """--mla-prefill auto: chunks of sequences reaching model/mla.SPARSE_PREFILL_FROM positions take the sparse
    path, shorter ones dense (here 50: the 90-token prompt sparse from its second chunk, the 33-token one dense);
    tokens equal the dense path's."""
    from tpserve.model import mla

    path = tiny("default")
    prompts = [{"prompt_token_ids": p} for p in random_prompts((90, 33), seed=4)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in _llm(path, mla_prefill="dense", max_num_batched_tokens=48)
            .generate(prompts, params)]
    monkeypatch.setattr(mla, "SPARSE_PREFILL_FROM", 50)
    calls, sparse = [], mla.MlaAttention._sparse

    def spy(self, q, *a, **kw):
        calls.append(q.shape[0])
        return sparse(self, q, *a, **kw)

    monkeypatch.setattr(mla.MlaAttention, "_sparse", spy)
    got = [o.outputs[0].token_ids for o in _llm(path, mla_prefill="auto", max_num_batched_tokens=48)
           .generate(prompts, params)]
    assert got == want
    assert any(n > 2 for n in calls), "no prefill chunk took the sparse path"  # (decode calls: 1-2 rows)
