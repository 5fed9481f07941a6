"""How many tokens to draft per step (adaptive k) and when to stop a draft chain early (truncation).

k is chosen per step to maximise expected emitted tokens per second. A sequence drafting k tokens
emits 1 + sum_{j<=k} prod_{i<=j} alpha_i tokens on average (alpha_i: the acceptance rate at draft
position i given the earlier ones were accepted), and the step costs
    step_cost = a + b * experts_touched(tokens) + c * tokens,  tokens = num_seqs * (1 + k)
plus draft_cost = d0 + d1 * k + d2 * num_seqs * k (per depth: launches on a GPU; per drafted
token: the MTP layer's compute, which dominates on a CPU and at large batches). experts_touched is
E (1 - (1 - topk/E)^tokens) per MoE layer (uniform routing). Verifying drafts is cheap when the
fixed part dominates (small batches) and dear when the per-token part does (large batches, or small
MoE batches where each extra token reads new experts). A request's own acceptance history scales
the global per-position rates (see _ratio).

Only exploration steps (every explore_every-th, k = max_k, no truncation) train the acceptance
estimates: on other steps truncation and small k would censor and bias them. Cost coefficients are
fitted online from every step by least squares in relative error, with a small ridge toward
priors, over a window of recent steps (choose_k refits every REFIT_EVERY observations).
Pure Python floats; all state lives in the instance.
"""

from __future__ import annotations

import math
from collections import deque
from operator import mul
from typing import NamedTuple

# Priors (seconds; guesses, replaced by the online fit within a few dozen steps). Step: 3 ms fixed,
# 30 us per token, and reading every expert of every MoE layer once costs as much as the fixed part
# (b = 3 ms / (E * layers)). Draft: 0.3 ms + 0.5 ms per depth + 8 us per drafted token (a quarter of
# the step's per-token prior: one layer of a few). With the acceptance prior 0.6, 0.54, ... a batch
# of 1 drafts (k = 2) and batches of 256 and more do not, dense or MoE.
STEP_FIXED_PRIOR, FULL_EXPERT_READ_PRIOR, PER_TOKEN_PRIOR = 3e-3, 3e-3, 30e-6
DRAFT_PRIOR = (3e-4, 5e-4, 8e-6)
ALPHA_PRIOR, ALPHA_DECAY = 0.6, 0.9   # prior acceptance at position i: 0.6 * 0.9^(i-1)
PRIOR_COUNT = 2.0                     # pseudo-observations behind the global acceptance prior
GLOBAL_MEMORY = 0.999                 # per-observation decay of global counts (~1000-obs memory)
REQUEST_WEIGHT = 8.0                  # a request's own ratio weighs n / (n + REQUEST_WEIGHT)
COST_WINDOW = 256                     # recent cost observations kept per fit
REFIT_EVERY, REFIT_WARMUP = 8, 32     # choose_k refits the cost models every 8 observations once 32 are
                                      # in (every one before): a fit is most of the policy's host time
RIDGE = 0.01                          # a coefficient 100% off its prior costs as much as 0.01 of
                                      # relative squared error (an observation 10% off costs 0.01)


class StepChoice(NamedTuple):  # (a tuple: made every step; a frozen dataclass's __init__ sets each field
    # through object.__setattr__)
    step: int      # 1-based step count
    explore: bool  # k = max_k and no truncation; acceptances of this step train the estimators


def _solve(m: list[list[float]], v: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting for a small symmetric positive-definite system."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[piv] = a[piv], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            for c in range(col, n + 1):
                a[r][c] -= f * a[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (a[r][n] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


def _accumulate(m: list[list[float]], v: list[float], x: list[float], y: float, w: float) -> None:
    """m += w x x^T, v += w x y (the normal equations of weighted least squares)."""
    for i, xi in enumerate(x):
        wx, row = w * xi, m[i]
        v[i] += wx * y
        for j, xj in enumerate(x):
            row[j] += wx * xj


class _RidgeFit:
    """y ~ theta . x over the last `window` observations by least squares in relative error (weight
    1 / y^2: timing noise scales with the time), with a ridge on the coefficients' relative distance
    from the prior scaled to the machine: RIDGE * sum_j ((theta_j - s prior_j) / (s prior_j))^2, s the
    geometric mean of y / (prior . x) over the window. The priors give the cost's shape, the data its
    magnitude: a CPU ten times slower than the priors' GPU is not pulled back toward GPU times. Directions
    the data do not determine (e.g. the per-token cost while only batch-1 steps were seen) stay at the
    scaled prior.
    Coefficients kept >= 0 (active set). The sums are incremental, recomputed from the window every
    `window` additions against rounding drift."""

    def __init__(self, prior: tuple[float, ...], window: int = COST_WINDOW):
        self.prior = list(prior)
        self.rows: deque[tuple[list[float], float, float, float]] = deque(maxlen=window)  # x, y, weight, log ratio
        d = len(prior)
        self._xtx, self._xty, self._log_scale = [[0.0] * d for _ in range(d)], [0.0] * d, 0.0
        self._adds = 0
        self._coef: list[float] = list(prior)
        self._fit_at = 0  # _adds when _coef was fitted

    def _log_ratio(self, x: list[float], y: float) -> float:
        return math.log(max(y, 1e-9) / max(sum(p * xi for p, xi in zip(self.prior, x)), 1e-12))

    def add(self, x: list[float], y: float) -> None:
        # (each row keeps its weight and log ratio: taking it out or summing again reuses them, the same floats)
        w, log_ratio = 1.0 / max(y, 1e-9) ** 2, self._log_ratio(x, y)
        if len(self.rows) == self.rows.maxlen:
            old_x, old_y, old_w, old_log_ratio = self.rows[0]
            _accumulate(self._xtx, self._xty, old_x, old_y, -old_w)
            self._log_scale -= old_log_ratio
        self.rows.append((x, y, w, log_ratio))
        _accumulate(self._xtx, self._xty, x, y, w)
        self._log_scale += log_ratio
        self._adds += 1
        if self._adds % self.rows.maxlen == 0:
            d = len(self.prior)
            self._xtx, self._xty = [[0.0] * d for _ in range(d)], [0.0] * d
            self._log_scale = sum(row[3] for row in self.rows)
            for rx, ry, rw, _ in self.rows:
                _accumulate(self._xtx, self._xty, rx, ry, rw)

    def coef(self, fresh: bool = True) -> list[float]:
        """The fitted coefficients; fresh=False may return a fit up to REFIT_EVERY observations old."""
        behind = self._adds - self._fit_at
        if behind and (fresh or self._adds <= REFIT_WARMUP or behind >= REFIT_EVERY):
            self._coef, self._fit_at = self._fit(), self._adds
        return self._coef

    def _fit(self) -> list[float]:
        d, xtx, xty = len(self.prior), self._xtx, self._xty
        scale = math.exp(self._log_scale / len(self.rows)) if self.rows else 1.0
        target = [scale * p for p in self.prior]
        # a zero prior (the expert term without MoE, whose feature is always 0): plain unit ridge to 0
        pen = [RIDGE / t ** 2 if t > 0 else 1.0 for t in target]
        free = list(range(d))
        while True:
            theta = [0.0] * d
            m = [[xtx[i][j] + (pen[i] if i == j else 0.0) for j in free] for i in free]
            v = [xty[i] + pen[i] * target[i] for i in free]
            for i, t in zip(free, _solve(m, v)):
                theta[i] = t
            worst = min(free, key=lambda i: theta[i])
            if theta[worst] >= 0 or len(free) == 1:
                return [max(t, 0.0) for t in theta]
            free.remove(worst)


class SpecPolicy:
    """Adaptive draft length and truncation for speculative decoding (see the module docstring).
    Per step: choice = begin_step(); k = choose_k(n, keys) (reads the step begin_step started);
    keep_drafting(choice.explore, survival) before each further draft position; observe_draft(k, s)
    and observe_step(tokens, s) with the measured times; observe_acceptance(key, drafted, accepted,
    choice.explore) per sequence; forget(key) when a request ends. Not thread-safe."""

    def __init__(self, max_k: int, adaptive: bool = True, truncate_threshold: float = 0.0, explore_every: int = 4,
                 num_experts: int = 0, experts_per_token: int = 0, num_moe_layers: int = 0):
        if not isinstance(max_k, int) or not 0 <= max_k <= 7:
            raise ValueError(f"max_k: must be an int in 0..7, got {max_k!r}")
        if not 0.0 <= truncate_threshold <= 1.0:
            raise ValueError(f"truncate_threshold: must be in [0, 1], got {truncate_threshold!r}")
        if not isinstance(explore_every, int) or explore_every < 1:
            raise ValueError(f"explore_every: must be an int >= 1, got {explore_every!r}")
        if num_experts < 0 or num_moe_layers < 0:
            raise ValueError(f"num_experts: and num_moe_layers: must be >= 0, got {num_experts}, {num_moe_layers}")
        if num_experts and not 1 <= experts_per_token <= num_experts:
            raise ValueError(f"experts_per_token: must be in 1..num_experts ({num_experts}), got {experts_per_token!r}")
        self.max_k, self.adaptive = max_k, adaptive
        self.fixed_k = max_k  # the k of every step when not adaptive (Speculator.set_adaptive may lower it)
        self.truncate_threshold, self.explore_every = truncate_threshold, explore_every
        self.num_experts, self.experts_per_token, self.num_moe_layers = num_experts, experts_per_token, num_moe_layers
        self._step, self._explore = 0, False
        prior = [ALPHA_PRIOR * ALPHA_DECAY ** i for i in range(max_k)]
        self._acc = [PRIOR_COUNT * a for a in prior]   # decayed accepted counts per position
        self._obs = [PRIOR_COUNT] * max_k              # decayed observation counts per position
        self._req: dict[object, list] = {}  # key -> [accepted, expected under global rates, observed, ratio]
        per_expert = FULL_EXPERT_READ_PRIOR / (num_experts * num_moe_layers) if num_experts and num_moe_layers else 0.0
        self._step_fit = _RidgeFit((STEP_FIXED_PRIOR, per_expert, PER_TOKEN_PRIOR))
        self._draft_fit = _RidgeFit(DRAFT_PRIOR)
        # choose_k's last answer and what it depended on: the acceptance estimates (_version counts their
        # changes: exploring steps' observations, forgets), the cost fits' coefficients (new lists when refitted)
        # and the batch, so most steps ask the same question again
        self._version, self._last_choice = 0, None
        self._last_gains: tuple | None = None  # expected_emitted's last batch and its gains

    # ------------------------------------------------------------------ steps
    def begin_step(self) -> StepChoice:
        """Start a step; every explore_every-th step (steps explore_every, 2*explore_every, ...) explores."""
        self._step += 1
        self._explore = self.max_k > 0 and self._step % self.explore_every == 0
        return StepChoice(self._step, self._explore)

    def choose_k(self, num_seqs: int, seq_keys: list, least: int = 0) -> int:
        """k in least..max_k for this step's batch (max_k on the current step if it explores; fixed_k when not
        adaptive). seq_keys: the keys of the sequences with estimates; missing ones use the global. least 1: the
        best k that drafts (where measurements have drafting ahead of plain decoding)."""
        if num_seqs < 0 or len(seq_keys) > num_seqs:
            raise ValueError(f"num_seqs: must be >= len(seq_keys) ({len(seq_keys)}), got {num_seqs}")
        if not self.adaptive:
            return self.fixed_k
        if self._explore or self.max_k == 0:
            return self.max_k
        if num_seqs == 0:
            return 0
        # the fits _choose reads (a refit where one is due: as often as if every step computed its choice)
        step, draft = self._step_fit.coef(fresh=False), self._draft_fit.coef(fresh=False)
        key = (self._version, step, draft, num_seqs, tuple(seq_keys), least)
        if self._last_choice is not None and self._last_choice[0] == key:
            return self._last_choice[1]
        best = self._choose(num_seqs, seq_keys, step, draft, least)
        self._last_choice = (key, best)
        return best

    def expected_emitted(self, num_seqs: int, seq_keys: list, k: int) -> float:
        """Expected tokens a step drafting k for each of these sequences emits (the acceptance estimates only)."""
        if not 0 <= k <= self.max_k:
            raise ValueError(f"k: must be in 0..max_k ({self.max_k}), got {k!r}")
        key = (self._version, num_seqs, tuple(seq_keys))
        if self._last_gains is None or self._last_gains[0] != key:
            self._last_gains = (key, self._gains(num_seqs, seq_keys))
        return self._last_gains[1][k]

    def _gains(self, num_seqs: int, seq_keys: list) -> list[float]:
        """Expected emitted tokens of the batch for k = 0..max_k. Request s has rates glob_i * r_s (see _ratio),
        so its expected emitted tokens for k are 1 + sum_{j<=k} G_j r_s^j with G_j = prod_{i<=j} glob_i: sum
        the powers of r over the batch."""
        glob = self.acceptance()
        if not glob:  # (max_k 0)
            return [float(num_seqs)]
        cap = 1.0 / max(max(glob), 1e-12)  # keeps every rate <= 1
        ratios = [min(own[3], cap) for own in map(self._req.get, seq_keys) if own is not None]
        unknown, powers, power_sums = num_seqs - len(ratios), ratios, [0.0]  # r = 1 for unknown keys
        for _ in range(self.max_k):
            power_sums.append(unknown + sum(powers))
            powers = list(map(mul, powers, ratios))
        gains, g_prod = [float(num_seqs)], 1.0
        for j in range(1, self.max_k + 1):
            g_prod *= glob[j - 1]
            gains.append(gains[-1] + g_prod * power_sums[j])
        return gains

    def _choose(self, num_seqs: int, seq_keys: list, step: list[float], draft: list[float], least: int = 0) -> int:
        gains = self._gains(num_seqs, seq_keys)
        best, best_rate = 0, (gains[0] / self._step_cost(step, num_seqs) if least == 0 else 0.0)
        for k in range(max(least, 1), self.max_k + 1):
            rate = gains[k] / (self._step_cost(step, num_seqs * (1 + k)) + self._draft_cost(draft, k, num_seqs))
            if rate > best_rate * (1 + 1e-9):
                best, best_rate = k, rate
        return best

    def keep_drafting(self, explore: bool, survival: float) -> bool:
        """Draft another position? survival: product of the draft's probabilities of its chain so far."""
        return explore or survival >= self.truncate_threshold

    # ------------------------------------------------------------ estimators
    def acceptance(self) -> list[float]:
        """The global acceptance rate estimate per draft position (1..max_k)."""
        return [a / o for a, o in zip(self._acc, self._obs)]

    @staticmethod
    def _ratio(accepted: float, expected: float, n: int) -> float:
        """A request's rates are the global ones times this ratio: its accepted / expected-under-the-
        global-rates over all positions it was seen at, blended toward 1 with weight
        n / (n + REQUEST_WEIGHT). One ratio rather than one rate per position: a request rejected at
        position 1 is rarely seen deeper, and its deeper positions should not keep the global rates."""
        w = n / (n + REQUEST_WEIGHT)
        return w * (accepted / expected if expected > 0 else 1.0) + (1 - w)

    def observe_acceptance(self, seq_key, drafted: int, accepted: int, explore: bool) -> None:
        """Positions 1..accepted were accepted, accepted+1 (if <= drafted) rejected, later ones not
        seen. Only exploration steps train (the others are ignored)."""
        if not 0 <= drafted <= self.max_k:
            raise ValueError(f"drafted: must be in 0..max_k ({self.max_k}), got {drafted}")
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted: must be in 0..drafted ({drafted}), got {accepted}")
        if not explore:
            return
        self._version += 1
        own = self._req.setdefault(seq_key, [0.0, 0.0, 0, 1.0])
        for i in range(min(accepted + 1, drafted)):
            hit = 1 if i < accepted else 0
            own[0] += hit
            own[1] += self._acc[i] / self._obs[i]
            own[2] += 1
            self._acc[i] = self._acc[i] * GLOBAL_MEMORY + hit
            self._obs[i] = self._obs[i] * GLOBAL_MEMORY + 1
        own[3] = self._ratio(own[0], own[1], own[2])

    def tracking(self) -> bool:
        """Whether any request has estimates here (forget would have something to drop)."""
        return bool(self._req)

    def forget(self, seq_key) -> None:
        """Drop a finished request's estimates (no-op for an unknown key)."""
        if self._req.pop(seq_key, None) is not None:
            self._version += 1

    # ----------------------------------------------------------------- costs
    def experts_touched(self, num_tokens: int) -> float:
        """Expected distinct experts read over all MoE layers under uniform routing."""
        if not self.num_experts or num_tokens <= 0:
            return 0.0
        e = self.num_experts
        return self.num_moe_layers * e * (1 - (1 - self.experts_per_token / e) ** num_tokens)

    def step_cost(self, num_tokens: int, fresh: bool = True) -> float:
        return self._step_cost(self._step_fit.coef(fresh), num_tokens)

    def draft_cost(self, k: int, num_seqs: int = 1, fresh: bool = True) -> float:
        return self._draft_cost(self._draft_fit.coef(fresh), k, num_seqs)

    def _step_cost(self, coef: list[float], num_tokens: int) -> float:
        a, b, c = coef
        return a + b * self.experts_touched(num_tokens) + c * num_tokens

    @staticmethod
    def _draft_cost(coef: list[float], k: int, num_seqs: int) -> float:
        d0, d1, d2 = coef
        return d0 + d1 * k + d2 * num_seqs * k if k > 0 else 0.0

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """One target step (verify or plain decode) of num_tokens tokens took `seconds`."""
        if num_tokens < 1:
            raise ValueError(f"num_tokens: must be >= 1, got {num_tokens}")
        if not seconds > 0:  # also NaN; the fit weighs observations by 1 / seconds^2
            raise ValueError(f"seconds: must be > 0, got {seconds}")
        self._step_fit.add([1.0, self.experts_touched(num_tokens), float(num_tokens)], seconds)

    def observe_draft(self, k: int, seconds: float, num_seqs: int = 1) -> None:
        """Drafting k positions for each of num_seqs sequences took `seconds`."""
        if not 1 <= k <= self.max_k:
            raise ValueError(f"k: must be in 1..max_k ({self.max_k}), got {k}")
        if not isinstance(num_seqs, int) or num_seqs < 1:
            raise ValueError(f"num_seqs: must be an int >= 1, got {num_seqs!r}")
        if not seconds > 0:  # also NaN; the fit weighs observations by 1 / seconds^2
            raise ValueError(f"seconds: must be > 0, got {seconds}")
        self._draft_fit.add([1.0, float(k), float(num_seqs * k)], seconds)

    def snapshot(self) -> dict:
        """Global acceptance rates by position and the fitted cost coefficients (for logs, benchmarks)."""
        a, b, c = self._step_fit.coef()
        d0, d1, d2 = self._draft_fit.coef()
        return {"step": self._step, "acceptance": self.acceptance(),
                "acceptance_obs": list(self._obs), "requests_tracked": len(self._req),
                "step_cost": {"a": a, "b_per_expert": b, "c_per_token": c, "n": len(self._step_fit.rows)},
                "draft_cost": {"d0": d0, "d1": d1, "d2_per_token": d2, "n": len(self._draft_fit.rows)}}
