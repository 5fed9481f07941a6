"""`tpserve bench fuzz`: schemathesis against a live server's /openapi.json, plus the hostile corpus.

Each generated case must get no 5xx and a response that is valid against the schema (status
code declared, body matching its model). Reports how many cases validation accepted (2xx).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field

from tpserve.tools.common import add_engine_args, engine_config_from_args

NUM_OPERATIONS = 9  # routes in /openapi.json (health, metrics, models, models/{id}, chat, completions, responses,
#                     tokenize, detokenize)
GENERATING = ("/chat/completions", "/v1/completions", "/v1/responses")  # routes whose cases --cap-tokens caps


def register(sub, bench, tune) -> None:
    p = bench.add_parser("fuzz", help="schemathesis and the hostile corpus against a server")
    add_engine_args(p)
    p.add_argument("--url", default=None, help="an already running server (default: start one here)")
    p.add_argument("--api-key", default=None, help="the key of the server at --url")
    p.add_argument("--cases", type=int, default=1000, help="schemathesis cases in all (spread over the routes)")
    p.add_argument("--cap-tokens", type=int, default=8,
                   help="at most this many new tokens (and n <= 2) per generated request (0: no cap)")
    p.add_argument("--negative", action="store_true", help="also generate schema-violating cases")
    p.add_argument("--skip-corpus", action="store_true", help="only schemathesis, not the hostile corpus")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here")
    p.set_defaults(func=run)


def run(args) -> int:
    from tpserve.tools.bench.hostile_corpus import run_corpus

    if args.cases < 1:
        raise ValueError("--cases must be positive")
    server = None
    url, headers = args.url, {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if url is None:
        from tpserve.server.local import LocalServer

        cfg = engine_config_from_args(args)
        if cfg.max_model_len is None:
            cfg = dataclasses.replace(cfg, max_model_len=256)  # bounds the generation of the cases that leave max_tokens out
        server = LocalServer(cfg)
        url = server.url
    try:
        modes = [False, True] if args.negative else [False]
        reports = {("negative" if neg else "positive"): run_until(
            url, args.cases, seed=args.seed or 0, headers=headers, negative=neg, cap_tokens=args.cap_tokens or None)
            for neg in modes}
        sent, wrong = (0, []) if args.skip_corpus else run_corpus(url, headers=headers)
        pools_full = server.pools_full() if server is not None else None
    finally:
        if server is not None:
            server.close()
    for name, rep in reports.items():
        print(f"schemathesis ({name}): {rep.summary()}")
        for f in rep.failures[:20]:
            print("  FAIL", f)
        for reason, count in rep.rejected.most_common(8):
            print(f"  rejected x{count}: {reason}")
    print(f"hostile corpus: {sent} cases, {len(wrong)} with an unexpected status")
    for case, status, body in wrong:
        print(f"  {case.name}: got {status}, expected {case.expect}: {body[:160]}")
    if pools_full is not None:
        print(f"every pool full afterwards: {pools_full}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"schemathesis": {k: {"cases": r.cases, "statuses": dict(r.statuses), "failures": r.failures,
                                            "accepted": r.accepted, "seconds": r.seconds} for k, r in reports.items()},
                       "corpus": {"cases": sent, "unexpected": [c.name for c, _, _ in wrong]},
                       "pools_full": pools_full}, f, indent=1)
    bad = any(r.failures or any(k >= 500 for k in r.statuses) for r in reports.values()) or wrong
    return 1 if bad or pools_full is False else 0


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


def run_until(url: str, cases: int, *, seed: int, max_rounds: int = 20, **kwargs) -> FuzzReport:
    """Rounds of run_schemathesis (seed, seed + 1, ...) until `cases` cases have been sent: hypothesis
    stops early on operations with few distinct inputs (GET /health has one)."""
    total = FuzzReport()
    for k in range(max_rounds):
        left = cases - total.cases
        if left <= 0:
            break
        rep = run_schemathesis(url, examples_per_operation=math.ceil(left / NUM_OPERATIONS) + 2 * k,
                               seed=seed + k, progress=True, **kwargs)
        total.cases += rep.cases
        total.statuses.update(rep.statuses)
        total.rejected.update(rep.rejected)
        total.failures += rep.failures
        total.seconds += rep.seconds
    return total


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
            if cap_tokens is not None and isinstance(case.body, dict) and op.path.endswith(GENERATING):
                _cap(case.body, cap_tokens, op.path.endswith("responses"))
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
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 - a failed check (a FailureGroup): record it, keep going
                report.failures.append(f"{op.method.upper()} {op.path} -> {response.status_code}: "
                                       f"{str(exc)[:400]}")

        one()
    bar.close()
    report.seconds = time.monotonic() - start
    return report


def _cap(body: dict, cap: int, responses: bool = False) -> None:
    keys = ("max_output_tokens",) if responses else ("max_tokens", "max_completion_tokens")
    for key in keys:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            body[key] = cap
    if all(body.get(key) is None for key in keys):
        body[keys[0]] = cap
    if isinstance(body.get("n"), int) and body["n"] > 2:
        body["n"] = 2
