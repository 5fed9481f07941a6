"""`tpserve bench serve`: a load test over the OpenAI API, shaped like `vllm bench serve`.

Targets --url (any OpenAI-compatible server) or starts `tpserve serve` as a process of its own
(server_process.py). For each
--concurrency level (a comma list sweeps) it sends --num-requests streaming completions
(optionally arriving as a Poisson process, --request-rate) and reports TTFT, TPOT, ITL and
E2E percentiles, throughput and errors. Every response is checked: a wrong token count, an
HTTP error or a broken stream is an error, and the command exits 1.

--cold-prefill salts every prompt (a unique head, and a unique cache_salt per request) so no prefix
cache can serve it and proves it: each response's usage.prompt_tokens_details.cached_tokens must be
0; if one is missing or not 0 the run is marked invalid (exit 1). --dataset multiturn runs
conversations that resend their history each turn, with the cache and replayed without it
(multiturn.py): hit rate and TTFT per turn. The GPU guard (gpu_guard.py) samples clocks, temperature and
throttle reasons meanwhile and flags a throttled run. Results: a table, --json, --plot (PNG).
--passes N runs the sweep N times on the same server (fresh prompts of the same shape each time) and
compares the first pass with the last: output tok/s and TTFT p99 ratios, the server's boot seconds and
the kernel specializations it first met during each pass (from /metrics, where it has them).
Load generation: bench_load.py; prompts: bench_datasets.py.
"""

from __future__ import annotations

from tpserve.tools.common import add_engine_args, engine_config_from_args


def register(sub, bench, tune) -> None:
    from tpserve.tools.bench.datasets import DATASETS

    p = bench.add_parser("serve", help="load test: TTFT / TPOT / ITL / E2E percentiles")
    add_engine_args(p)
    p.add_argument("--url", default=None, help="an already running server (default: start `tpserve serve` with "
                   "this command's model and engine flags, a process of its own)")
    p.add_argument("--api-key", default=None, help="bearer token for --url (default: $OPENAI_API_KEY)")
    p.add_argument("--served-model", default=None, help="model name to send (default: the first listed)")
    p.add_argument("--concurrency", default="64", help="max requests in flight; a comma list sweeps (1,4,16)")
    p.add_argument("--num-requests", type=int, default=None, help="requests per level (default: the concurrency)")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrivals per second (default inf: all at once)")
    p.add_argument("--max-tokens", type=int, default=200, help="output tokens per request (ignore_eos)")
    p.add_argument("--dataset", default="random", choices=DATASETS)
    p.add_argument("--dataset-path", default=None, help="JSONL file for --dataset jsonl")
    p.add_argument("--prompt-len", type=int, default=32,
                   help="prompt length in tokens (--dataset random; multiturn: the first message, in words)")
    p.add_argument("--turns", type=int, default=4, help="turns per conversation (--dataset multiturn)")
    p.add_argument("--turn-len", type=int, default=64,
                   help="words of each later turn's new user message or tool result (--dataset multiturn)")
    p.add_argument("--cold-prefill", action="store_true",
                   help="salt every prompt and require cached_tokens == 0 in every response")
    p.add_argument("--prompt-seed", type=int, default=0, help="seed of the prompts and the Poisson arrivals")
    p.add_argument("--passes", type=int, default=1, help="run the sweep N times on one server and compare the first "
                   "pass with the last (fresh prompts of the same shape each pass)")
    p.add_argument("--pause", type=float, default=0.0, help="seconds the server idles before each pass after the "
                   "first (an idle host or GPU may start slower: a pause tells that from first-use costs)")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here ('-': stdout)")
    p.add_argument("--plot", default=None, help="write a PNG (latency percentiles and throughput per level)")
    p.set_defaults(func=run)


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--concurrency must be integers separated by commas, got {text!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise ValueError(f"--concurrency levels must be at least 1, got {text!r}")
    return levels


def _table(levels: list[dict]) -> list[str]:
    lines = ["| conc | rate | ok/req | out tok/s | req/s | TTFT p50/p90/p99 ms | TPOT p50/p90/p99 ms "
             "| ITL p50/p90/p99 ms | E2E p50/p90/p99 ms |", "|" + " --- |" * 9]
    f3 = lambda d: "/".join(f"{v:.1f}" for v in d.values())  # noqa: E731
    for lv in levels:
        lines.append(f"| {lv['concurrency']} | {lv['request_rate']} | {lv['completed']}/{lv['requests']} | "
                     f"{lv['output_tok_per_s']:.1f} | {lv['requests_per_s']:.2f} | {f3(lv['ttft_ms'])} | "
                     f"{f3(lv['tpot_ms'])} | {f3(lv['itl_ms'])} | {f3(lv['e2e_ms'])} |")
    return lines


def report(res: dict) -> str:
    lines = [f"{res['url']} ({res['model']}): dataset {res['dataset']}, {res['max_tokens']} output tokens per "
             f"request{', cold prefill' if res['cold_prefill'] else ''}"]
    boot = res.get("boot") or {}
    if "boot_seconds" in boot:
        lines.append(f"server ready in {boot['boot_seconds']:.1f} s (load {boot['boot_load_seconds']:.1f} s, "
                     f"warm-up {boot['boot_warmup_seconds']:.1f} s)")
    passes = res.get("passes") or [{"levels": res["levels"]}]
    for i, one in enumerate(passes):
        if len(passes) > 1:
            met = one.get("kernels_met")
            lines.append(f"pass {i + 1}{' (the first after boot)' if i == 0 else ''}"
                         f"{'' if met is None else f': {met} kernel specializations first met'}")
        lines += _table(one["levels"])
    for row in res.get("first_pass", []):
        lines.append(f"first pass / pass {len(passes)} at concurrency {row['concurrency']}: output tok/s "
                     f"{row['tok_per_s_ratio']:.3f}, TTFT p99 {row['ttft_p99_ratio']:.3f}")
    for lv in res["levels"]:
        if "mean_accepted_length" in lv:
            lines.append(f"speculative decoding at concurrency {lv['concurrency']}: mean accepted length "
                         f"{lv['mean_accepted_length']:.2f}")
    for lv in res["levels"]:
        if "turns" in lv:
            from tpserve.tools.bench.multiturn import report_lines

            lines.extend(report_lines(lv))
    for lv in res["levels"]:
        for err in sorted(set(lv["errors"]))[:3]:
            lines.append(f"ERROR (concurrency {lv['concurrency']}, {lv['errors'].count(err)}x): {err}")
    if res["cold_prefill"]:
        lines.append("cold prefill: " + ("VALID, cached_tokens == 0 in every response" if res["cold_valid"] else
                                         "INVALID: " + "; ".join(v for lv in res["levels"]
                                                                 for v in lv.get("cold_violations", [])[:3])))
    lines.append(res["gpu_guard_line"])
    if "pool_full_after" in res:
        lines.append(f"pool full again after the run: {res['pool_full_after']}")
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    if res["dataset"] == "multiturn":
        from tpserve.tools.bench.multiturn import plot_multiturn

        return plot_multiturn(res, path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = res["levels"]
    xs = [lv["concurrency"] for lv in levels]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, title in ((axes[0], "ttft_ms", "TTFT (ms)"), (axes[1], "tpot_ms", "TPOT (ms)")):
        for q in ("p50", "p90", "p99"):
            ax.plot(xs, [lv[key][q] for lv in levels], marker="o", label=q)
        ax.set_title(title)
    axes[2].plot(xs, [lv["output_tok_per_s"] for lv in levels], marker="o", color="C3")
    axes[2].set_title("output tokens / s")
    for ax in axes:
        ax.set_xlabel("concurrency")
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"{res['model']} at {res['url']}: {res['dataset']}, {res['max_tokens']} tokens"
                 f"{' (THROTTLED)' if res['gpu_guard']['throttled'] else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def server_metrics(url: str, headers: dict) -> dict:
    """What the report reads of the server's /metrics: speculative-decoding counters, boot seconds, kernel
    specializations met after ready ({} when it has none or hides them)."""
    import httpx

    names = {"tpserve:spec_decode_num_drafts_total": "drafts",
             "tpserve:spec_decode_num_accepted_tokens_total": "accepted",
             **{f"tpserve:{k}": k for k in ("boot_seconds", "boot_load_seconds", "boot_warmup_seconds",
                                            "kernels_after_ready")}}
    try:
        text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    except httpx.HTTPError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            out[names[name]] = float(value)
    return out


def bench(url: str, args, headers: dict, model: str) -> dict:
    import asyncio
    import time

    from tpserve.tools.bench.datasets import load_prompts, salt
    from tpserve.tools.bench.load import run_level
    from tpserve.tools.bench.gpu_guard import GpuGuard

    passes = []
    with GpuGuard() as guard:
        for i in range(args.passes):
            if i and args.pause:
                time.sleep(args.pause)
            levels, start = [], server_metrics(url, headers)
            for k, conc in enumerate(_levels(args.concurrency)):
                if args.dataset == "multiturn":
                    from tpserve.tools.bench.multiturn import bench_multiturn

                    levels.append(bench_multiturn(url, args, headers, model, conc))
                    continue
                n = args.num_requests or conc
                seed = args.prompt_seed + k + 1000 * i  # (each pass: fresh prompts, nothing a prefix cache holds)
                prompts = load_prompts(args.dataset, n, prompt_len=args.prompt_len, path=args.dataset_path, seed=seed)
                if args.cold_prefill:
                    prompts = salt(prompts)
                before = server_metrics(url, headers)
                levels.append(asyncio.run(run_level(url, model, prompts, concurrency=conc,
                                                    max_tokens=args.max_tokens, cold=args.cold_prefill,
                                                    request_rate=args.request_rate, seed=seed, headers=headers,
                                                    desc=f"concurrency {conc}" + (f", pass {i + 1}" if i else ""))))
                after = server_metrics(url, headers)
                drafts = after.get("drafts", 0) - before.get("drafts", 0)
                if drafts > 0:  # a server with speculative decoding: accepted drafts per verify, plus its own token
                    levels[-1]["mean_accepted_length"] = 1 + (after["accepted"] - before["accepted"]) / drafts
            one = {"levels": levels}
            after = server_metrics(url, headers)
            if "kernels_after_ready" in start and "kernels_after_ready" in after:
                one["kernels_met"] = int(after["kernels_after_ready"] - start["kernels_after_ready"])
            passes.append(one)
    every = [lv for one in passes for lv in one["levels"]]
    res = {"url": url, "model": model, "dataset": args.dataset, "max_tokens": args.max_tokens,
           "cold_prefill": args.cold_prefill, "levels": passes[0]["levels"],
           "errors": [e for lv in every for e in lv["errors"]], "gpu_guard": guard.summary(),
           "gpu_guard_line": guard.line(), "boot": {k: v for k, v in start.items() if k.startswith("boot_")}}
    if args.passes > 1:
        res["passes"] = passes
        res["first_pass"] = [{"concurrency": a["concurrency"],
                              "tok_per_s_ratio": a["output_tok_per_s"] / max(b["output_tok_per_s"], 1e-9),
                              "ttft_p99_ratio": a["ttft_ms"]["p99"] / max(b["ttft_ms"]["p99"], 1e-9)}
                             for a, b in zip(passes[0]["levels"], passes[-1]["levels"])]
    if args.cold_prefill or args.dataset == "multiturn":  # (multiturn: its cold pass)
        res["cold_valid"] = all(lv["cold_valid"] for lv in every)
    return res


def run(args) -> int:
    from tpserve.tools.client import Client, ToolError, emit_json, friendly

    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.turns < 1 or args.turn_len < 1:
        raise ValueError(f"--turns and --turn-len must be at least 1, got {args.turns} and {args.turn_len}")
    if args.passes < 1:
        raise ValueError(f"--passes must be at least 1, got {args.passes}")
    if not 0 <= args.pause < float("inf"):
        raise ValueError(f"--pause must be a number of seconds >= 0, got {args.pause}")
    _levels(args.concurrency)

    @friendly
    def go(args) -> int:
        server = None
        url = args.url
        if url is None:
            from tpserve.tools.bench.server_process import ServerProcess

            engine_config_from_args(args)  # a bad flag fails here, before a process starts
            server = ServerProcess(args)
            url = server.url
        client = Client(url, args.api_key, args.served_model)
        try:
            model = client.model  # reachability and the API key, one clear error
            res = bench(client.url, args, client.headers, model)
            if server is not None:
                res["pool_full_after"] = server.pools_full()
        finally:
            client.close()
            if server is not None:
                server.close()
        if args.json_out != "-":
            print(report(res))
        emit_json(args.json_out, res)
        if args.plot:
            plot(res, args.plot)
        bad = bool(res["errors"]) or res.get("cold_valid") is False
        if not res["levels"] or not isinstance(res["levels"][0], dict):
            raise ToolError("no results")
        return 1 if bad or res.get("pool_full_after") is False else 0

    return go(args)
