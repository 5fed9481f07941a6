"""`tpserve bench fuzz`: schemathesis against a live server's /openapi.json, plus the hostile corpus.

Each generated case must get no 5xx and a response that is valid against the schema (status
code declared, body matching its model). Reports how many cases validation accepted (2xx).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field


@dataclass
class FuzzReport:
    cases: int = 0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)  # 5xx or a response outside the schema
    rejected: collections.Counter = field(default_factory=collections.Counter)  # 4xx by `param`
    seconds: float = 0.0

    @property
    def accepted(self) -> float:
        return sum(v for k, v in self.statuses.items() if 200 <= k < 300) / max(self.cases, 1)

    def summary(self) -> str:
        codes = ", ".join(f"{k}: {v}" for k, v in sorted(self.statuses.items()))
        return (f"{self.cases} cases in {self.seconds:.1f} s; statuses {{{codes}}}; {self.accepted:.0%} accepted; "
                f"{len(self.failures)} failures")


def run_schemathesis(url: str, *, examples_per_operation: int, seed: int = 0, headers: dict | None = None,
                     negative: bool = False, progress: bool = False, cap_tokens: int | None = None) -> FuzzReport:
    """Generate cases for every operation of url/openapi.json and check each response.

    `cap_tokens` (for a time-bounded run on CPU): generation requests get at most this many new
    tokens per sample and n <= 2 (their other fields stay as generated)."""
    import hypothesis
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.checks import not_a_server_error, response_schema_conformance, status_code_conformance
    from tqdm import tqdm

    headers = dict(headers or {})
    schema = schemathesis.openapi.from_url(url + "/openapi.json", headers=headers)
    mode = schemathesis.GenerationMode.NEGATIVE if negative else schemathesis.GenerationMode.POSITIVE
    report = FuzzReport()
    start = time.monotonic()
    operations = [op.ok() for op in schema.get_all_operations()]
    bar = tqdm(total=len(operations) * examples_per_operation, desc="fuzz", disable=not progress)
    checks = (not_a_server_error, status_code_conformance, response_schema_conformance)
    for op in operations:
        @settings(max_examples=examples_per_operation, deadline=None, derandomize=True, database=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)
        @given(case=op.as_strategy(generation_mode=mode))
        @hypothesis.seed(seed)
        def one(case):
            if cap_tokens is not None and isinstance(case.body, dict) and op.path.endswith("completions"):
                _cap(case.body, cap_tokens)
            response = case.call(base_url=url, headers=headers, timeout=60)
            report.cases += 1
            report.statuses[response.status_code] += 1
            bar.update(1)
            if 400 <= response.status_code < 500:
                try:
                    err = response.json()['error']
                    report.rejected[f"{op.path} {err.get('param')}: {err.get('message', '')[:80]}"] += 1
                except Exception:  # noqa: BLE001 - not an error body: the schema check reports it
                    pass
            try:
                case.validate_response(response, checks=checks)
            except Exception as exc:  # noqa: BLE001 - a failed check: record it, keep going
                report.failures.append(f"{op.method.upper()} {op.path} -> {response.status_code}: "
                                       f"{str(exc)[:400]}")

        one()
    bar.close()
    report.seconds = time.monotonic() - start
    return report


def _cap(body: dict, cap: int) -> None:
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            body[key] = cap
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = cap
    if isinstance(body.get("n"), int) and body["n"] > 2:
        body["n"] = 2
