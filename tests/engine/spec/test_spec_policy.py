"""SpecPolicy: exploration cadence, truncation, acceptance estimates, cost fit, and the choice of k."""

import math
import random

import pytest

from tpserve.engine.spec.policy import SpecPolicy

MOE = dict(num_experts=64, experts_per_token=4, num_moe_layers=10)


def _explore_steps(policy: SpecPolicy, n: int) -> list[bool]:
    return [policy.begin_step().explore for _ in range(n)]


def _train_acceptance(policy: SpecPolicy, rates, n: int, rng: random.Random, key="r", explore=True):
    """n draft chains of length len(rates); position i accepted with probability rates[i] given the
    earlier ones were."""
    for _ in range(n):
        accepted = 0
        for r in rates:
            if rng.random() >= r:
                break
            accepted += 1
        policy.observe_acceptance(key, len(rates), accepted, explore)


def _train_costs(policy: SpecPolicy, a, b, c, d0, d1, rng: random.Random, n=256, noise=0.01, d2=0.0):
    for _ in range(n):
        tokens = int(math.exp(rng.uniform(0, math.log(2048))))
        t = a + b * policy.experts_touched(tokens) + c * tokens
        policy.observe_step(tokens, t * (1 + rng.uniform(-noise, noise)))
        k, seqs = rng.randint(1, policy.max_k), rng.choice([1, 2, 4, 8, 16, 32])
        policy.observe_draft(k, (d0 + d1 * k + d2 * seqs * k) * (1 + rng.uniform(-noise, noise)), seqs)


def _non_explore(policy: SpecPolicy) -> None:
    """Advance to a step that does not explore."""
    while policy.begin_step().explore:
        pass


def test_exploration_cadence():
    assert _explore_steps(SpecPolicy(4, explore_every=4), 12) == [False, False, False, True] * 3
    assert _explore_steps(SpecPolicy(4, explore_every=1), 5) == [True] * 5
    assert _explore_steps(SpecPolicy(0, explore_every=1), 5) == [False] * 5  # nothing to explore
    policy = SpecPolicy(5, explore_every=3)
    ks = []
    for _ in range(6):
        policy.begin_step()
        ks.append(policy.choose_k(1024, []))  # a batch where drafting does not pay
    assert ks == [0, 0, 5, 0, 0, 5]
    assert [policy.begin_step().step for _ in range(2)] == [7, 8]


def test_truncation_threshold_and_explore_override():
    policy = SpecPolicy(4, truncate_threshold=0.3)
    assert policy.keep_drafting(False, 0.31) and policy.keep_drafting(False, 0.3)
    assert not policy.keep_drafting(False, 0.29)
    assert policy.keep_drafting(True, 0.01) and policy.keep_drafting(True, 0.0)
    assert SpecPolicy(4, truncate_threshold=0.0).keep_drafting(False, 0.0)
    assert not SpecPolicy(4, truncate_threshold=1.0).keep_drafting(False, 0.999)



def test_no_truncation_by_default():
    """Truncation is off unless asked for (BENCHMARKS.md, speculative decoding); the engine's config and the
    policy agree."""
    from tpserve.config import SpeculativeConfig

    spec = SpeculativeConfig.parse('{"method": "mtp", "num_speculative_tokens": 3}')
    assert spec.truncate_threshold == 0.0
    assert SpecPolicy(4).keep_drafting(False, 1e-9)
    assert SpecPolicy(4, truncate_threshold=spec.truncate_threshold).keep_drafting(False, 0.0)


def test_position_accounting():
    policy = SpecPolicy(4)
    before = policy.snapshot()
    policy.observe_acceptance("r", 3, 1, explore=True)  # pos 1 accepted, pos 2 rejected, pos 3 unseen
    after = policy.snapshot()
    obs0, obs1 = before["acceptance_obs"], after["acceptance_obs"]
    assert obs1[:2] == pytest.approx([obs0[0] * 0.999 + 1, obs0[1] * 0.999 + 1]) and obs1[2:] == obs0[2:]
    assert after["acceptance"][0] > before["acceptance"][0] and after["acceptance"][1] < before["acceptance"][1]
    policy.observe_acceptance("r", 2, 2, explore=True)  # all drafted accepted: no rejection seen
    assert policy.snapshot()["acceptance_obs"][2] == obs0[2]
    assert policy.snapshot()["requests_tracked"] == 1


def test_estimator_learns_rates_and_ignores_non_explore():
    rng = random.Random(0)
    policy = SpecPolicy(3)
    _train_acceptance(policy, [0.9, 0.7, 0.5], 4000, rng)
    learned = policy.snapshot()["acceptance"]
    assert all(abs(e - t) < 0.05 for e, t in zip(learned, [0.9, 0.7, 0.5])), learned
    _train_acceptance(policy, [0.1, 0.1, 0.1], 2000, rng, explore=False)
    assert policy.snapshot()["acceptance"] == learned


def test_cost_fit_recovers_coefficients():
    rng = random.Random(1)
    policy = SpecPolicy(5, **MOE)
    a, b, c, d0, d1, d2 = 2e-3, 10e-6, 50e-6, 1e-4, 8e-4, 40e-6
    _train_costs(policy, a, b, c, d0, d1, rng, d2=d2)
    snap = policy.snapshot()
    fit = snap["step_cost"]
    for got, want in ((fit["a"], a), (fit["b_per_expert"], b), (fit["c_per_token"], c),
                      (snap["draft_cost"]["d0"], d0), (snap["draft_cost"]["d1"], d1),
                      (snap["draft_cost"]["d2_per_token"], d2)):
        assert abs(got - want) < 0.1 * want, (got, want)
    assert fit["n"] == 256
    # a bounded window: the fit follows a change of regime
    _train_costs(policy, 4e-3, b, c, d0, d1, rng, n=300)
    assert abs(policy.snapshot()["step_cost"]["a"] - 4e-3) < 0.4e-3


@pytest.mark.parametrize("scale", [0.1, 10.0, 30.0])
def test_cost_fit_is_not_pulled_toward_the_priors_magnitude(scale):
    """A machine `scale` times slower (a CPU) or faster than the priors: 40 steps fit every cost
    coefficient within 10% (a ridge toward the unscaled priors would pull the fit toward their magnitude)."""
    from tpserve.engine.spec.policy import DRAFT_PRIOR, PER_TOKEN_PRIOR, STEP_FIXED_PRIOR

    rng = random.Random(5)
    policy = SpecPolicy(5)
    a, c = STEP_FIXED_PRIOR * scale * 1.3, PER_TOKEN_PRIOR * scale * 0.7
    d0, d1, d2 = (p * scale * f for p, f in zip(DRAFT_PRIOR, (0.8, 1.2, 1.5)))
    _train_costs(policy, a, 0.0, c, d0, d1, rng, n=40, d2=d2)
    snap = policy.snapshot()
    got = (snap["step_cost"]["a"], snap["step_cost"]["c_per_token"], snap["draft_cost"]["d0"],
           snap["draft_cost"]["d1"], snap["draft_cost"]["d2_per_token"])
    for g, want in zip(got, (a, c, d0, d1, d2)):
        assert abs(g - want) < 0.1 * want, (got, (a, c, d0, d1, d2))


def test_experts_touched():
    policy = SpecPolicy(2, **MOE)
    assert policy.experts_touched(1) == pytest.approx(40.0)  # 4 experts in each of 10 layers
    assert policy.experts_touched(10_000) == pytest.approx(640.0)
    assert SpecPolicy(2).experts_touched(100) == 0.0


def test_priors_draft_at_batch_1_not_at_large_batches():
    for kw in ({}, MOE):
        policy = SpecPolicy(5, **kw)
        assert policy.choose_k(1, []) >= 1
        assert policy.choose_k(512, []) == 0


def test_choose_k_large_when_fixed_cost_dominates_zero_when_tokens_dominate():
    rng = random.Random(2)
    policy = SpecPolicy(5, **MOE)
    _train_acceptance(policy, [0.95] * 5, 3000, rng)
    _train_costs(policy, 10e-3, 1e-7, 1e-6, 1e-4, 2e-4, rng)
    _non_explore(policy)
    assert policy.choose_k(1, []) == 5
    per_token = SpecPolicy(5, **MOE)
    _train_acceptance(per_token, [0.95] * 5, 3000, rng)
    _train_costs(per_token, 0.5e-3, 1e-7, 300e-6, 1e-4, 2e-4, rng)
    _non_explore(per_token)
    assert per_token.choose_k(64, []) == 0
    assert per_token.choose_k(64, [], least=1) == 1  # its best k that drafts: the one that costs least
    assert per_token.choose_k(1, []) >= 1  # at batch 1 the fixed part still dominates


def test_draft_cost_per_drafted_token_lowers_k_at_larger_batches():
    """Where the drafter's cost grows with the tokens it drafts (a CPU, a large batch), the fitted
    per-token term makes batch 16 draft less than batch 1 (with the draft cost fitted per depth only,
    as before, batch 16 drafted as if it cost what batch 1's drafts cost)."""
    rng = random.Random(4)
    policy = SpecPolicy(5)
    _train_acceptance(policy, [0.95] * 5, 3000, rng)
    _train_costs(policy, 2e-3, 0.0, 100e-6, 1e-4, 1e-4, rng, d2=200e-6)
    _non_explore(policy)
    assert policy.choose_k(1, []) == 5
    assert policy.choose_k(16, []) == 0
    assert policy.draft_cost(3, 16) > 8 * policy.draft_cost(3, 1)  # 1e-4 + 3e-4 + 16 * 6e-4 vs 1e-3


def test_not_adaptive_always_max_k():
    policy = SpecPolicy(3, adaptive=False)
    for _ in range(8):
        policy.begin_step()
        assert policy.choose_k(4096, []) == 3 and policy.choose_k(1, []) == 3


def test_request_estimates_shift_k():
    rng = random.Random(3)
    policy = SpecPolicy(5)
    _train_costs(policy, 5e-3, 0.0, 20e-6, 2e-4, 4e-4, rng)
    for i in range(200):
        _train_acceptance(policy, [0.9] * 5, 10, rng, key=f"good{i}")
    _train_acceptance(policy, [0.05] * 5, 40, rng, key="bad")
    _non_explore(policy)
    good_k, bad_k = policy.choose_k(1, ["good0"]), policy.choose_k(1, ["bad"])
    assert good_k >= 3 and bad_k < good_k, (good_k, bad_k)
    assert policy.choose_k(1, []) == policy.choose_k(1, ["unknown"]) == good_k
    policy.forget("bad")
    policy.forget("never seen")
    assert policy.choose_k(1, ["bad"]) == good_k


def test_expected_emitted_is_one_plus_the_chance_of_each_draft_surviving():
    """A step drafting k for each request emits, per request, 1 + sum_j prod_{i<=j} alpha_i (the global rates,
    scaled per request by its own acceptance): the prior at first, less for a request seen to draft badly."""
    policy = SpecPolicy(3)
    alpha = [0.6, 0.6 * 0.9, 0.6 * 0.81]
    one = 1 + alpha[0] + alpha[0] * alpha[1] + alpha[0] * alpha[1] * alpha[2]
    assert policy.expected_emitted(1, [], 3) == pytest.approx(one)
    assert policy.expected_emitted(4, ["a", "b"], 3) == pytest.approx(4 * one)
    assert policy.expected_emitted(2, [], 0) == 2.0
    assert policy.expected_emitted(1, [], 1) == pytest.approx(1 + alpha[0])
    _train_acceptance(policy, [0.0] * 3, 20, random.Random(0), key="bad")
    assert 1.0 < policy.expected_emitted(1, ["bad"], 3) < policy.expected_emitted(1, ["new"], 3)
    with pytest.raises(ValueError, match="k: must be in 0..max_k"):
        policy.expected_emitted(1, [], 4)
    assert SpecPolicy(0).expected_emitted(3, [], 0) == 3.0


def test_validation_names_the_field():
    bad = [(dict(max_k=8), "max_k"), (dict(max_k=-1), "max_k"), (dict(max_k=2.0), "max_k"),
           (dict(max_k=2, truncate_threshold=1.5), "truncate_threshold"),
           (dict(max_k=2, truncate_threshold=-0.1), "truncate_threshold"),
           (dict(max_k=2, explore_every=0), "explore_every"),
           (dict(max_k=2, num_experts=8, experts_per_token=9, num_moe_layers=1), "experts_per_token"),
           (dict(max_k=2, num_experts=-1), "num_experts")]
    for kwargs, field in bad:
        with pytest.raises(ValueError, match=field):
            SpecPolicy(**kwargs)
    policy = SpecPolicy(3)
    for call, field in ((lambda: policy.observe_acceptance("r", 4, 0, True), "drafted"),
                        (lambda: policy.observe_acceptance("r", 2, 3, True), "accepted"),
                        (lambda: policy.observe_step(0, 0.1), "num_tokens"),
                        (lambda: policy.observe_step(4, float("nan")), "seconds"),
                        (lambda: policy.observe_draft(2, 0.0), "seconds"),
                        (lambda: policy.observe_draft(4, 0.1), "k"),
                        (lambda: policy.observe_draft(2, 0.1, 0), "num_seqs"),
                        (lambda: policy.choose_k(1, ["a", "b"]), "num_seqs")):
        with pytest.raises(ValueError, match=field):
            call()


def test_choose_k_refits_the_cost_models_every_few_observations():
    """choose_k reads a cost fit at most REFIT_EVERY observations old once REFIT_WARMUP are in (a fit is
    most of the policy's time per step); snapshot() and step_cost() always see a fresh one."""
    from tpserve.engine.spec import policy as sp

    policy = sp.SpecPolicy(3)
    fit = policy._step_fit
    for i in range(sp.REFIT_WARMUP):
        policy.observe_step(4, 3e-3 + 1e-5 * i)
        assert fit.coef(fresh=False) is fit.coef(fresh=False)        # refit at every observation so far
        assert fit._fit_at == fit._adds
    held = fit.coef(fresh=False)
    for _ in range(sp.REFIT_EVERY - 1):
        policy.observe_step(4, 9e-3)
        assert fit.coef(fresh=False) is held                           # stale by design, within the bound
    policy.observe_step(4, 9e-3)
    assert fit.coef(fresh=False) is not held and fit._fit_at == fit._adds
    policy.observe_step(4, 9e-3)
    stale = fit.coef(fresh=False)
    assert policy.snapshot()["step_cost"]["a"] == fit.coef()[0] and fit._fit_at == fit._adds
    assert stale is not fit.coef()


def test_choose_k_sees_a_refit_made_outside_it():
    """A refit outside choose_k (snapshot() reads fresh fits) changes the answer at once, as recomputing would:
    dear drafting at batch 64 seen in fewer than REFIT_EVERY observations moves choose_k only when refitted."""
    policy = SpecPolicy(3)
    for i in range(40):
        policy.observe_step(64 * (1 + i % 4), 3e-3 + 1e-6 * i)
        policy.observe_draft(1 + i % 3, 3e-4 + 1e-6 * i, 1)
    _non_explore(policy)
    assert policy.choose_k(64, []) == 3
    for _ in range(7):  # (7 < REFIT_EVERY: choose_k's fits stay as they were)
        policy.observe_draft(3, 1e-2, 64)
    _non_explore(policy)
    assert policy.choose_k(64, []) == 3
    policy.snapshot()
    _non_explore(policy)
    assert policy.choose_k(64, []) == 0
    policy._last_choice = None
    assert policy.choose_k(64, []) == 0


def test_choose_k_remembers_only_what_nothing_observed_since_would_change():
    """choose_k keeps its last answer while the batch, the acceptance estimates and the cost fits' coefficients
    are unchanged (most steps: acceptance trains on exploring steps only, the fits change every REFIT_EVERY
    observations): a policy answering from that memory and one recomputing every time give the same k through
    a run of observations, forgets, batch changes and refits outside choose_k (snapshot() refits: a memory keyed
    on observations alone answered from before it)."""
    rng = random.Random(5)
    remembering, fresh = (SpecPolicy(5, **MOE) for _ in range(2))
    asked, computed, batch = 0, [], 1
    choose = remembering._choose
    remembering._choose = lambda *a: computed.append(1) or choose(*a)
    for step in range(600):
        for p in (remembering, fresh):
            p.begin_step()
        if rng.random() < 0.05:  # the batch changes now and then
            batch = rng.choice([1, 4, 40])
        keys = [f"r{i}" for i in range(min(batch, 3))]
        fresh._last_choice = None
        k = remembering.choose_k(batch, keys)
        assert k == fresh.choose_k(batch, keys), step
        asked += 1
        kind = rng.random()
        for p in (remembering, fresh):
            rng_p = random.Random(step)  # the same observation on both
            if kind < 0.2:
                _train_acceptance(p, [0.9, 0.7, 0.5], 1, rng_p, key=rng_p.choice(keys), explore=step % 2 == 0)
            elif kind < 0.3:
                p.observe_step(rng_p.randint(1, 64), 1e-3 * (1 + rng_p.random()))
            elif kind < 0.35:
                p.observe_draft(rng_p.randint(1, 5), 2e-4 * (1 + rng_p.random()), rng_p.randint(1, 4))
            elif kind < 0.37:
                p.forget(rng_p.choice(keys))
            elif kind < 0.39:
                p.snapshot()
    assert asked == 600 and remembering._version == fresh._version > 50
    assert len(computed) < asked / 3  # (exploring steps answer max_k without computing)
