"""What speculative steps measure about themselves (engine/spec/speculator.py): decode rates with and without drafts
per batch size (`MeasuredRates`, which overrides the policy's k where measurements disagree with its cost model)
and the drafter's calibration (`Calibration`)."""

from __future__ import annotations

import math
from collections import deque


def _bucket(batch: int) -> int:
    """The power-of-two bucket of a batch size: 1, 2, 3-4, 5-8, ... by their upper ends (0 goes with 1)."""
    return 1 << (batch - 1).bit_length() if batch > 1 else 1


class _RateWindow:
    """One mode's last WINDOW steps: rate = tokens / seconds, each step's time capped at OUTLIER x the
    window's median. The cap (a sort) is recomputed, and every step capped again, every 8th step (and
    whenever asked); in between the window's sums are updated in place. Every step in the window is capped
    at the current cap (the steps before its recompute were capped again then), so capped times are not
    kept: min(seconds, cap) where needed."""

    WINDOW, OUTLIER = 16, 3.0

    def __init__(self):
        self.step_tokens: deque[int] = deque(maxlen=self.WINDOW)
        self.step_seconds: deque[float] = deque(maxlen=self.WINDOW)
        self.tokens, self.seconds, self.cap, self.added = 0.0, 0.0, 0.0, 0

    def __len__(self) -> int:
        return len(self.step_seconds)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    def add(self, tokens: int, seconds: float, recap: bool = False) -> bool:
        """-> whether the cap was recomputed."""
        step_seconds = self.step_seconds
        self.added += 1
        if recap or self.added % 8 == 0:
            self.step_tokens.append(tokens)
            step_seconds.append(seconds)
            ordered = sorted(step_seconds)
            cap = self.cap = self.OUTLIER * ordered[len(ordered) // 2]
            self.tokens = sum(self.step_tokens)
            if ordered[-1] <= cap:  # no step above the cap (most often): the plain sum, the same float
                self.seconds = sum(step_seconds)
            else:
                self.seconds = sum([s if s < cap else cap for s in step_seconds])
            return True
        cap = self.cap
        if len(step_seconds) == self.WINDOW:
            old = step_seconds[0]
            self.tokens -= self.step_tokens[0]
            self.seconds -= old if old < cap else cap
        self.step_tokens.append(tokens)
        step_seconds.append(seconds)
        self.tokens += tokens
        self.seconds += seconds if seconds < cap else cap
        return False


class MeasuredRates:
    """Emitted tokens per second actually measured, for steps with and without drafts, per batch-size
    bucket (powers of two): the policy's cost model sees tokens and experts, not what the machine does
    with them (graphs for some steps, host overheads, a compute-bound CPU). A step's time is its whole cycle, the
    host's work between steps included: a drafting step's holds the drafting pass that made its drafts; a plain
    step's leaves out the MTP catch-up, as plain decoding does once the MTP layer stops, and counts its host work
    as overlapped with the forward where plain decoding runs with async scheduling (the speculator's `_observe`).
    Steps run while the speculator stands aside are plain decoding as it is then, and are measured too (`idle`).

    A mode's rate is tokens / seconds over its last steps, each step's time capped (`_RateWindow`): one drafting
    step emits 1..k+1 tokens, so single steps say little, and a compile or a GC pause in one step must not decide
    the mode. Where the speculator gives the tokens the running requests are expected to emit a drafting step
    (`gain`: the policy's acceptance estimates, per request), the modes compare at the running batch: drafting's
    rate is that gain over its measured time a step, plain decoding's the batch over its own. The windows then
    hold the machine's costs, and the acceptance of whichever requests drafted last (a prompt the drafter guessed
    badly) does not decide for the next ones.
    The modes are compared once each has MIN_OBS steps; until then the policy's k, with a plain step
    whenever plain decoding has not run for PLAIN_PROBE steps. Then the slower mode runs again once it has not
    run for SPEC_PROBE steps (CLEAR_PROBE when the faster leads by more than CLEAR_LEAD, WIDE_PROBE by more than
    WIDE_LEAD; each probe costs a step or two in the slower mode): counted from its last measured step, so a
    probe that found no sequence able to draft (their MTP stopped) stays due until one can (the next request).
    k = 0 where drafting is measured slower, the policy's k where faster (its best k of at least 1 where its cost
    model gives 0: the speculator's `_choose_k`)."""

    PLAIN_PROBE, SPEC_PROBE, CLEAR_PROBE, CLEAR_LEAD, WIDE_PROBE, WIDE_LEAD = 8, 64, 256, 1.25, 1024, 1.5
    MIN_OBS, WINDOW = 4, _RateWindow.WINDOW

    def __init__(self):
        self.window: dict[tuple[int, bool], _RateWindow] = {}  # (bucket, drafted) -> that mode's recent steps
        self.last_seen: dict[tuple[int, bool], int] = {}  # the `step` count at the mode's last observation
        # bucket -> (slower mode's key, probe every, plain steps shorter than a drafting step)
        self._decision: dict[int, tuple[tuple[int, bool], int, int]] = {}
        self._gain: dict[int, tuple[float, int]] = {}  # bucket -> the last (gain, batch) asked about
        self.step = 0

    @property
    def rates(self) -> dict[tuple[int, bool], float]:
        return {key: w.rate for key, w in self.window.items()}

    @staticmethod
    def bucket(batch: int) -> int:
        return _bucket(batch)

    def observe(self, batch: int, drafted: bool, emitted: int, seconds: float) -> None:
        if emitted <= 0 or not seconds > 0:
            return
        b = _bucket(batch)
        key = (b, drafted)
        win = self.window.get(key)
        if win is None:
            win = self.window[key] = _RateWindow()
        recapped = win.add(emitted, seconds, len(win.step_seconds) < self.MIN_OBS)
        self.last_seen[key] = self.step
        decision = self._decision.get(b)
        if recapped or decision is None or decision[0] == key:  # the faster mode's rate moves little step to step
            self._decide(b)

    def _compared(self, b: int, asked: tuple[float, int] | None = None) -> tuple[float, float] | None:
        """Bucket b's (plain, drafting) tok/s as the modes are compared (at `asked`, a (gain, batch), where given,
        else at the last one asked about), or None before both have MIN_OBS steps."""
        plain_win, spec_win = self.window.get((b, False)), self.window.get((b, True))
        if plain_win is None or spec_win is None or min(len(plain_win), len(spec_win)) < self.MIN_OBS:
            return None
        asked = asked or self._gain.get(b)
        if asked is not None:  # at the batch asked about: its tokens a step over each mode's time a step
            gain, batch = asked
            return batch * len(plain_win) / plain_win.seconds, gain * len(spec_win) / spec_win.seconds
        return plain_win.rate, spec_win.rate

    def saved_per_token(self, batch: int, gain: float | None = None) -> float | None:
        """Seconds drafting saves per token the batch emits, against plain decoding, in this batch's bucket as the
        modes are compared (negative: it costs); gain: the tokens a drafting step of this batch is expected to
        emit (None: as last asked about). None where not both measured, or where drafting was last
        measured longer ago than its probe interval (stale: it must run to be measured again)."""
        b = _bucket(batch)
        compared = self._compared(b, (gain, batch) if gain is not None and batch > 0 else None)
        decision = self._decision.get(b)
        if compared is None or decision is None or self.step - self.last_seen[(b, True)] >= decision[1]:
            return None
        plain, spec = compared
        return 1.0 / plain - 1.0 / spec if min(plain, spec) > 0 else None

    def _decide(self, b: int) -> None:
        """Bucket b's slower mode and how often it is re-measured, once both modes are measured."""
        compared = self._compared(b)
        if compared is None:
            return
        plain, spec = compared
        plain_key, spec_key = (b, False), (b, True)
        plain_win, spec_win = self.window[plain_key], self.window[spec_key]
        lead = spec / plain if spec > plain else plain / spec  # (max / min)
        every = (self.SPEC_PROBE if lead <= self.CLEAR_LEAD else self.CLEAR_PROBE if lead <= self.WIDE_LEAD
                 else self.WIDE_PROBE)
        # the most plain steps that take less time than one drafting step: L with L * plain < drafting
        within = math.ceil((spec_win.seconds / len(spec_win)) / (plain_win.seconds / len(plain_win))) - 1
        self._decision[b] = (spec_key if spec < plain else plain_key, every, within)

    def _set_gain(self, batch: int, gain: float | None) -> int:
        """-> the batch's bucket, its decision made again where the gain asked about changed."""
        b, seen = _bucket(batch), (gain, batch)
        if gain is not None and batch > 0 and seen != self._gain.get(b):  # (batch 0: nothing running)
            self._gain[b] = seen
            if b in self._decision:
                self._decide(b)
        return b

    def measured_k(self, batch: int, k: int, gain: float | None = None) -> tuple[int, int] | None:
        """Where both modes are measured in this batch's bucket: `override`'s k from the measurements alone, and
        the most plain steps that measure shorter than one drafting step (`_decide`); None where not (nothing
        ticked then: the caller goes on to `override`). gain: the tokens a drafting step of k is expected to
        emit for the running requests (None: as the measured drafting steps emitted)."""
        decision = self._decision.get(self._set_gain(batch, gain))
        if decision is None:
            return None
        self.step += 1  # (tick)
        return (self._decided(decision, k) if k else 0), decision[2]

    def plain_leads(self, batch: int) -> bool:
        """Whether both modes are measured in this batch's bucket and drafting is the slower."""
        decision = self._decision.get(_bucket(batch))
        return decision is not None and decision[0][1]

    def drafting_leads(self, batch: int) -> bool:
        """Whether both modes are measured in this batch's bucket and plain decoding is the slower."""
        decision = self._decision.get(_bucket(batch))
        return decision is not None and not decision[0][1]

    def tick(self) -> None:
        """A step the speculator was not asked about (Speculator.idle): the probes' clock counts it too."""
        self.step += 1

    def override(self, batch: int, k: int, gain: float | None = None) -> int:
        self.step += 1  # (tick)
        if k == 0:
            return 0
        b = self._set_gain(batch, gain)
        decision = self._decision.get(b)
        if decision is None:  # not both measured: the policy's k, plain decoding now and then
            plain_key = (b, False)
            measured = len(self.window.get(plain_key, ())) >= self.MIN_OBS
            return 0 if not measured and self.step - self.last_seen.get(plain_key, 0) >= self.PLAIN_PROBE else k
        return self._decided(decision, k)

    def _decided(self, decision: tuple, k: int) -> int:
        """k > 0 as the measurements have it: the slower mode runs once it is due."""
        slower, every, _ = decision
        due = self.step - self.last_seen[slower] >= every
        return (k if due else 0) if slower[1] else (0 if due else k)

    def snapshot(self) -> dict:
        out = {}
        for (b, d), w in sorted(self.window.items()):
            row = out[f"batch<={b} {'spec' if d else 'plain'}"] = {"tok_s": round(w.rate, 1), "steps": len(w),
                                                                   "ms_per_step": round(1e3 * w.seconds / len(w), 3)}
            if b in self._gain:  # the rates it decides by, at the batch last asked about (`_decide`)
                gain, batch = self._gain[b]
                row["expected_tok_s"] = round((gain if d else batch) * len(w) / w.seconds, 1)
                row["at_batch"] = batch
        return out


class PassCost:
    """What a pass over some rows costs (a prompt's MTP pass, its catch-up and first drafts; or a step with prompt
    rows), from the last WINDOW passes measured (seconds, rows): a fixed part (launches), the least pass time, plus
    a part a row, the least (time - fixed part) / rows over the passes at least twice as long as the least one's (a
    short pass's time says nothing of a row's). Where no such pass was measured the part a row is taken as 0: a long
    prompt's pass then runs and is measured, where pricing it as the short passes' time a row would skip it for good
    (skipped passes are not measured). Least times: wall time only gains from noise, so one slow pass does not stop
    the later ones; passes that compiled a kernel are not measured (the speculator's `_compiled`).
    `ran` and `skipped` count the prompts the pay-back rule let run or sent to plain decoding."""

    WINDOW = 16

    def __init__(self):
        self.seen: deque[tuple[float, int]] = deque(maxlen=self.WINDOW)
        self.ran = self.skipped = 0

    def observe(self, seconds: float, rows: int) -> None:
        self.seen.append((seconds, max(rows, 1)))

    def parts(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds a row), None before any pass was measured."""
        if not self.seen:
            return None
        fixed, rows = min(self.seen)
        per_row = [(t - fixed) / r for t, r in self.seen if r >= 2 * rows]
        return fixed, min(per_row, default=0.0)

    def estimate(self, rows: int) -> float | None:
        """Seconds a pass over `rows` is expected to take, None before any was measured."""
        parts = self.parts()
        return None if parts is None else parts[0] + parts[1] * rows

    def snapshot(self) -> dict:
        out = {"pass_ms": None, "row_ms": None, "rows_most": None, "measured": len(self.seen), "ran": self.ran,
               "skipped": self.skipped}
        parts = self.parts()
        if parts is not None:
            out.update(pass_ms=round(1e3 * parts[0], 3), row_ms=round(1e3 * parts[1], 5),
                       rows_most=max(r for _, r in self.seen))
        return out


class Calibration:
    """How far the drafter's own probabilities are from the measured acceptance: factor = accepted /
    sum of the probabilities of the drafts verified (exploration steps only, so truncation does not
    bias it). Survival for truncation is the product of min(1, factor * p) along the chain: a drafter
    that is right more often than its probabilities say (the demo model's) is not cut short."""

    PRIOR = 20.0  # pseudo-observations at factor 1

    def __init__(self):
        self.accepted, self.prob_sum = self.PRIOR, self.PRIOR

    @property
    def factor(self) -> float:
        return self.accepted / self.prob_sum

    def observe(self, sure: list[float], accepted: int) -> None:
        """Draft probabilities of the positions verified (the first `accepted` of them were accepted)."""
        self.accepted += accepted
        self.prob_sum += sum(sure)
