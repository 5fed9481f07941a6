"""The batched sampler against a row-by-row reference (the sampler as it was before batching)."""

import random

import torch

from tpserve.engine import sampler
from tpserve.engine.request import Sequence
from tpserve.sampling_params import SamplingParams


def _reference_filter(logits, top_k, top_p, min_p):
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = logits.sort(descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) > top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def _reference_sample(logits, seqs):
    """One row at a time, unbatched (penalties are shared code)."""
    logits = sampler._apply_penalties(logits.clone(), seqs)
    out = []
    for row, seq in enumerate(seqs):
        p = seq.params
        if p.greedy:
            out.append(int(logits[row].argmax()))
            continue
        probs = _reference_filter(logits[row] / p.temperature, p.top_k, p.top_p, p.min_p).softmax(-1)
        noise = torch.empty_like(probs).exponential_(generator=seq.generator)
        out.append(int((probs / noise).argmax()))
    return out


def _seqs(rng, n, vocab, seed_base):
    seqs = []
    for i in range(n):
        greedy = rng.random() < 0.3
        params = SamplingParams(temperature=0 if greedy else rng.choice([0.5, 1.0, 1.7]),
                                top_k=rng.choice([0, 1, 5, 40]), top_p=rng.choice([1.0, 0.9, 0.5]),
                                min_p=rng.choice([0.0, 0.05]), repetition_penalty=rng.choice([1.0, 1.3]),
                                presence_penalty=rng.choice([0.0, 0.4]), frequency_penalty=rng.choice([0.0, 0.2]),
                                logprobs=rng.choice([None, 0, 3]), seed=seed_base + i)
        seq = Sequence("r", i, [rng.randrange(vocab) for _ in range(5)], params, 10, frozenset())
        seq.output_ids = [rng.randrange(vocab) for _ in range(rng.randrange(4))]
        seqs.append(seq)
    return seqs


def _generators(seqs):
    for s in seqs:
        s.generator = torch.Generator().manual_seed(s.params.seed)


def test_batched_sampler_equals_row_by_row_reference():
    rng, vocab = random.Random(0), 97
    for trial in range(20):
        seqs = _seqs(rng, 9, vocab, 100 * trial)
        logits = torch.randn(len(seqs), vocab, generator=torch.Generator().manual_seed(trial)) * 3
        _generators(seqs)
        want = _reference_sample(logits, seqs)
        _generators(seqs)
        got = sampler.sample(logits.clone(), seqs, torch.Generator())
        assert [r.token for r in got] == want
        raw = logits.log_softmax(-1)
        for seq, res, row in zip(seqs, got, raw):
            if seq.params.logprobs is None:
                assert res.logprob is None and res.top is None
                continue
            assert abs(res.logprob - row[res.token].item()) < 1e-6
            assert res.top[res.token].rank == int((row > row[res.token]).sum()) + 1
            best = row.topk(seq.params.logprobs).indices.tolist() if seq.params.logprobs else []
            assert [t for t, lp in res.top.items() if lp.rank <= len(best)] == best


def test_unseeded_rows_draw_from_the_engine_generator():
    vocab = 50
    seqs = [Sequence("r", i, [1], SamplingParams(temperature=1.0), 5, frozenset()) for i in range(4)]
    logits = torch.zeros(4, vocab)
    a = [r.token for r in sampler.sample(logits, seqs, torch.Generator().manual_seed(3))]
    b = [r.token for r in sampler.sample(logits, seqs, torch.Generator().manual_seed(3))]
    c = [r.token for r in sampler.sample(logits, seqs, torch.Generator().manual_seed(4))]
    assert a == b and a != c and len(set(a)) > 1  # rows get different draws


def test_uniform_sampling_is_uniform():
    """Chi-square with a fixed seed: temperature 1 on equal logits over 8 tokens."""
    seqs = [Sequence("r", i, [1], SamplingParams(temperature=1.0), 5, frozenset()) for i in range(4000)]
    toks = torch.tensor([r.token for r in sampler.sample(torch.zeros(4000, 8), seqs,
                                                         torch.Generator().manual_seed(0))])
    counts = torch.bincount(toks, minlength=8).float()
    chi2 = ((counts - 500) ** 2 / 500).sum().item()
    assert chi2 < 24.3  # 99.9th percentile of chi-square with 7 degrees of freedom


def test_huge_top_k_is_off_not_an_overflow():
    seqs = [Sequence("r", 0, [1], SamplingParams(temperature=1.0, top_k=123456789012345, seed=1), 5, frozenset())]
    seqs[0].generator = torch.Generator().manual_seed(1)
    assert 0 <= sampler.sample(torch.randn(1, 30), seqs, torch.Generator())[0].token < 30


def test_batches_where_no_row_uses_a_filter_skip_it_and_sample_the_same():
    """A filter that no row uses is skipped (top-k's full-vocabulary sort, min-p's softmax) and a batch with every
    row sampled takes no index: tokens equal the row-by-row reference, for seeded rows and for unseeded ones (which
    draw [n, V] from the engine's generator in one go)."""
    rng, vocab = random.Random(1), 61
    settings = [dict(), dict(top_p=0.8), dict(min_p=0.1), dict(top_k=7), dict(top_k=7, top_p=0.9, min_p=0.05)]
    for trial, extra in enumerate(settings * 4):
        seeded = trial % 2 == 0
        seqs = [Sequence("r", i, [1], SamplingParams(temperature=rng.choice([0.7, 1.3]), seed=trial * 10 + i
                                                     if seeded else None, **extra), 5, frozenset())
                for i in range(5)]
        logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(trial)) * 3
        if seeded:
            _generators(seqs)
            want = _reference_sample(logits, seqs)
            _generators(seqs)
        else:  # the reference's rows in order from one generator = one [n, V] draw of it
            gen = torch.Generator().manual_seed(trial)
            for s in seqs:
                s.generator = gen
            want = _reference_sample(logits, seqs)
            for s in seqs:
                s.generator = None
        got = sampler.sample(logits.clone(), seqs, torch.Generator().manual_seed(trial))
        assert [r.token for r in got] == want, extra
