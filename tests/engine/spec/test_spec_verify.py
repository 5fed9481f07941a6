"""Rejection sampling for speculative decoding: the emitted tokens are distributed as the target p.

Each distribution test batches 20,000 independent trials as rows ("draft from q, then verify") and
compares the emitted-token histogram with p by Pearson's chi-square statistic. The seeds are fixed,
so the tests are deterministic; the critical values are those of a correct sampler failing with
probability 0.001. Mutants checked by hand fail them: resampling from p instead of the residual
(chi-square 2494 with df 5), accepting with probability p[d] instead of min(1, p/q) (3241), no
clamp on the residual (2494), always accepting (141019).
"""

import pytest
import torch

from tpserve.engine.spec.verify import rejection_tokens, rejection_verify, sample_from, sample_tokens

# Chi-square critical values at alpha = 0.001, by degrees of freedom (from the standard table,
# e.g. scipy.stats.chi2.ppf(0.999, df)).
# df 0 (p one-hot): the statistic is 0 and _chi_square already checks that no token left the support.
CHI2_CRIT_0_001 = {0: 0.0, 1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515}
TRIALS = 20_000


def _dist(values):
    t = torch.tensor(values, dtype=torch.float64)
    return (t / t.sum()).float()


def _chi_square(tokens: list[int], p: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over the support of p, and its degrees of freedom. Tokens outside the
    support fail at once (their expected count is 0)."""
    counts = torch.bincount(torch.tensor(tokens), minlength=p.numel()).double()
    support = p > 0
    assert counts[~support].sum() == 0, f"tokens where p is 0: {counts.tolist()}"
    expected = p.double()[support] * len(tokens)
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    return stat, int(support.sum()) - 1


def _draft_and_verify(p: torch.Tensor, q: torch.Tensor, seed: int = 0, n: int = TRIALS):
    gen = torch.Generator().manual_seed(seed)
    big_p, big_q = p.expand(n, -1).contiguous(), q.expand(n, -1).contiguous()
    none = [None] * n
    drafts = torch.tensor(sample_from(big_q, none, gen))
    accepted, tokens = rejection_verify(big_p, big_q, drafts, none, gen)
    return drafts, accepted, tokens


CASES = {
    "q far from p": ([40, 25, 15, 10, 6, 4], [2, 3, 5, 10, 30, 50]),
    "q equals p": ([40, 25, 15, 10, 6, 4], [40, 25, 15, 10, 6, 4]),
    "p zero where q has mass": ([50, 30, 20, 0, 0, 0], [1, 1, 1, 1, 1, 1]),
    "q zero where p has mass": ([1, 1, 1, 1, 1, 1], [50, 50, 0, 0, 0, 0]),
    "p one-hot": ([0, 0, 1, 0, 0, 0], [30, 10, 10, 10, 10, 30]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_emitted_tokens_follow_p(name):
    p, q = (_dist(v) for v in CASES[name])
    drafts, accepted, tokens = _draft_and_verify(p, q, seed=len(name))
    stat, df = _chi_square(tokens, p)
    assert stat <= CHI2_CRIT_0_001[df], f"{name}: chi-square {stat:.1f} with df {df}"
    # the drafts themselves follow q (sample_from is right)
    stat_q, df_q = _chi_square(drafts.tolist(), q)
    assert stat_q <= CHI2_CRIT_0_001[df_q], f"{name}: drafts chi-square {stat_q:.1f}"
    # acceptance rate is sum_x min(p, q) (within 5 standard errors); accepted tokens are the drafts
    beta = float(torch.minimum(p, q).sum())
    rate = sum(accepted) / len(accepted)
    assert abs(rate - beta) < 5 * (beta * (1 - beta) / len(accepted)) ** 0.5 + 1e-9, (rate, beta)
    assert all(t == d for t, d, a in zip(tokens, drafts.tolist(), accepted) if a)


def test_q_equals_p_always_accepts():
    p = _dist([40, 25, 15, 10, 6, 4])
    drafts, accepted, tokens = _draft_and_verify(p, p, n=2000)
    assert all(accepted) and tokens == drafts.tolist()


def test_rows_with_different_distributions():
    """Each row is verified against its own p and q (no mixing across rows)."""
    n = 3000
    p = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1.0], [0, 0.5, 0.5, 0]]).repeat(n, 1)
    q = torch.tensor([[0.25] * 4, [0.7, 0.1, 0.1, 0.1], [0, 0.5, 0.5, 0]]).repeat(n, 1)
    gen = torch.Generator().manual_seed(3)
    drafts = torch.tensor(sample_from(q, [None] * len(p), gen))
    _, tokens = rejection_verify(p, q, drafts, [None] * len(p), gen)
    assert set(tokens[0::3]) == {0} and set(tokens[1::3]) == {3} and set(tokens[2::3]) == {1, 2}


def _seeded_run(p, q, drafts, seeds, engine_seed=0):
    gens = [None if s is None else torch.Generator().manual_seed(s) for s in seeds]
    return rejection_verify(p, q, drafts, gens, torch.Generator().manual_seed(engine_seed))


def test_same_seeds_same_results_whatever_the_batch():
    torch.manual_seed(0)
    n, vocab = 64, 50
    p, q = torch.rand(n, vocab).softmax(-1), torch.rand(n, vocab).softmax(-1)
    drafts = torch.randint(vocab, (n,))
    seeds = [None if i % 3 == 0 else 1000 + i for i in range(n)]
    first = _seeded_run(p, q, drafts, seeds)
    assert first == _seeded_run(p, q, drafts, seeds)
    assert first != _seeded_run(p, q, drafts, [s and s + 1 for s in seeds])  # the seeds matter
    # a seeded row gives the same result alone as in the batch
    for i in (1, 2, 5):
        alone = _seeded_run(p[i:i + 1], q[i:i + 1], drafts[i:i + 1], [seeds[i]], engine_seed=99)
        assert alone == ([first[0][i]], [first[1][i]])
    # sample_from follows the same rule
    gens = [torch.Generator().manual_seed(7), None]
    twice = [sample_from(p[:2], [torch.Generator().manual_seed(7), None], torch.Generator().manual_seed(1))
             for _ in range(2)]
    assert twice[0] == twice[1] == sample_from(p[:2], gens, torch.Generator().manual_seed(1))


def test_shape_errors_name_the_argument():
    p = torch.full((2, 5), 0.2)
    d = torch.tensor([0, 1])
    g = torch.Generator()
    cases = [
        (lambda: rejection_verify(p[0], p[0], d[:1], [None], g), "p:"),
        (lambda: rejection_verify(p, p[:, :4], d, [None, None], g), "q:"),
        (lambda: rejection_verify(p, p, d[:1], [None, None], g), "drafts:"),
        (lambda: rejection_verify(p, p, d.int(), [None, None], g), "drafts:"),
        (lambda: rejection_verify(p, p, torch.tensor([0, 5]), [None, None], g), "drafts:"),
        (lambda: rejection_verify(p, p, torch.tensor([-1, 0]), [None, None], g), "drafts:"),
        (lambda: rejection_verify(p, p, d, [None], g), "generators:"),
        (lambda: sample_from(p[0], [None], g), "probs:"),
        (lambda: sample_from(p, [None], g), "generators:"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=name):
            call()
    assert rejection_verify(p[:0], p[:0], d[:0], [], g) == ([], [])
    assert sample_from(p[:0], [], g) == []


def test_device_forms_draw_as_the_host_forms():
    """rejection_tokens and sample_tokens (the speculator's: no host copy) give what rejection_verify and
    sample_from give from the same generators, and flag a draft id outside the vocabulary instead of raising."""
    torch.manual_seed(1)
    n, vocab = 16, 30
    p, q = torch.rand(n, vocab).softmax(-1), torch.rand(n, vocab).softmax(-1)
    drafts = torch.randint(vocab, (n,))

    def gens():
        return [torch.Generator().manual_seed(50 + i) if i % 2 else None for i in range(n)]

    want = rejection_verify(p, q, drafts, gens(), torch.Generator().manual_seed(3))
    accept, token, bad = rejection_tokens(p, q, drafts, gens(), torch.Generator().manual_seed(3))
    assert (accept.tolist(), token.tolist()) == want and not bad.any()
    assert sample_tokens(p, gens(), torch.Generator().manual_seed(4)).tolist() == sample_from(
        p, gens(), torch.Generator().manual_seed(4))
    flagged = rejection_tokens(p[:2], q[:2], torch.tensor([3, vocab]), [None, None], torch.Generator())[2]
    assert flagged.tolist() == [False, True]
    assert rejection_tokens(p[:0], q[:0], drafts[:0], [], torch.Generator())[1].numel() == 0
