"""The first `bench serve` pass after boot against the second, with the warm-up and without it.

    python bench/first_pass.py [--layers KKKM] [--size real|tiny] [--device cuda] [--modes cold,restart,no-warmup]
                               [--concurrency 16] [--num-requests 64] [--max-tokens 200] [--prompt-len 32]
                               [--dir /tmp/tpserve-first-pass] [--triton-dir D] [--json F] [extra `bench serve` / engine flags]

Writes GLM-5.3-Flash's real widths with the given layer schedule as a checkpoint without weights (random ones:
--load-format dummy) with make-tiny's tokenizer at the model's vocabulary (streamed text, so TTFT is measured), then
for each mode runs `tpserve bench serve --passes 2` on it in a process of its own:
  cold       the warm-up on, an empty Triton cache: the boot compiles and tunes every kernel
  restart    the warm-up on, the cache the cold boot filled (reused across restarts)
  no-warmup  --no-warmup, an empty Triton cache: the first requests compile what they meet
Prints per mode the boot (engine load and warm-up, and since the process started), each pass's output tok/s and
TTFT p99, pass 1 / pass 2 for both, and the kernel specializations first met during each pass (compiles the warm-up
missed); then each pass's longest TTFTs with when their requests were sent (which requests waited). `--size tiny --device cpu` runs the same on make-tiny widths (a test of this script).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

READY = re.compile(r"ready in ([\d.]+) s .*the process started ([\d.]+) s ago")


def run_mode(args, mode: str, cfg_dir: Path, extra: list[str]) -> dict:
    out = args.dir / f"{mode}.json"
    cache = (args.triton_dir or args.dir / "triton-restart") if mode in ("cold", "restart") else \
        args.dir / "triton-no-warmup"
    if mode in ("cold", "no-warmup") and cache.exists():
        import shutil

        shutil.rmtree(cache)
    cmd = [sys.executable, "-m", "tpserve.cli", "bench", "serve", "--model", str(cfg_dir), "--load-format", "dummy",
           "--device", args.device, "--passes", "2", "--concurrency", str(args.concurrency),
           "--num-requests", str(args.num_requests), "--max-tokens", str(args.max_tokens), "--prompt-len",
           str(args.prompt_len), "--json", str(out), "--no-warmup" if mode == "no-warmup" else "--warmup", *extra]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache), "TPSERVE_LOG_LEVEL": "INFO"}
    log = args.dir / f"{mode}.log"
    with open(log, "w") as f:  # written as it runs: the warm-up's phases show while it boots
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, env=env)
    text = log.read_text()
    if proc.returncode != 0 or not out.is_file():
        raise SystemExit(f"{mode}: bench serve failed (rc {proc.returncode}):\n{text[-4000:]}")
    res = json.loads(out.read_text())
    ready = READY.findall(text)
    passes = res["passes"]
    row = {"mode": mode, "boot": res.get("boot", {}), "process_ready_s": float(ready[-1][1]) if ready else None,
           "errors": res["errors"], "passes": [{"tok_per_s": p["levels"][0]["output_tok_per_s"],
                                                "ttft_p99_ms": p["levels"][0]["ttft_ms"]["p99"],
                                                "kernels_met": p.get("kernels_met"),
                                                "slowest": _slowest(p["levels"][0])} for p in passes]}
    row["tok_per_s_ratio"] = res["first_pass"][0]["tok_per_s_ratio"]
    row["ttft_p99_ratio"] = res["first_pass"][0]["ttft_p99_ratio"]
    return row


def _slowest(level: dict, n: int = 5) -> list[list[float]]:
    """The n longest TTFTs of a pass as [sent ms after its first request, TTFT ms] (bench serve's timeline)."""
    timed = [t[:2] for t in level.get("timeline_ms", []) if t[1] is not None]
    return sorted(timed, key=lambda t: -t[1])[:n]


def table(rows: list[dict]) -> str:
    lines = ["| mode | boot s (load / warm-up) | since process start s | pass 1 tok/s | pass 2 tok/s | 1 / 2 "
             "| pass 1 TTFT p99 ms | pass 2 TTFT p99 ms | 1 / 2 | kernels met in pass 1 / 2 |", "|" + " --- |" * 10]
    for r in rows:
        b, (p1, p2) = r["boot"], r["passes"]
        boot = (f"{b['boot_seconds']:.1f} ({b['boot_load_seconds']:.1f} / {b['boot_warmup_seconds']:.1f})"
                if "boot_seconds" in b else "-")
        ready = "-" if r["process_ready_s"] is None else f"{r['process_ready_s']:.1f}"
        met = " / ".join("-" if p["kernels_met"] is None else str(p["kernels_met"]) for p in (p1, p2))
        lines.append(f"| {r['mode']} | {boot} | {ready} | {p1['tok_per_s']:.1f} | {p2['tok_per_s']:.1f} | "
                     f"{r['tok_per_s_ratio']:.3f} | {p1['ttft_p99_ms']:.1f} | {p2['ttft_p99_ms']:.1f} | "
                     f"{r['ttft_p99_ratio']:.3f} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="KKKM", help="layer schedule, K (KDA) and M (MLA), as `bench model`")
    ap.add_argument("--size", choices=("real", "tiny"), default="real")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--modes", default="cold,restart,no-warmup")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tpserve-first-pass"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--triton-dir", type=Path, default=None,
                    help="Triton's cache of the cold and restart boots (default DIR/triton-restart)")
    args, extra = ap.parse_known_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = set(modes) - {"cold", "restart", "no-warmup"}
    if bad or not modes:
        raise SystemExit(f"--modes: cold, restart and no-warmup only, got {args.modes!r}")
    from tpserve.model.config import ModelConfig
    from tpserve.model.tiny_tokenizer import write_tiny_tokenizer
    from tpserve.tools.bench.model import real_width_config

    cfg_dir = args.dir / f"config-{args.layers}-{args.size}"
    cfg = real_width_config(args.layers, False, args.size)
    write_tiny_tokenizer(cfg_dir, ModelConfig.from_dict(cfg).vocab_size)
    (cfg_dir / "config.json").write_text(json.dumps(cfg))
    rows = [run_mode(args, mode, cfg_dir, extra) for mode in modes]
    print(f"{args.layers} ({args.size} widths, random weights) on {args.device}: concurrency {args.concurrency}, "
          f"{args.num_requests} requests a pass, {args.prompt_len}-token prompts, {args.max_tokens} output tokens")
    print(table(rows))
    for r in rows:
        for i, p in enumerate(r["passes"]):
            print(f"{r['mode']} pass {i + 1}: longest TTFTs (sent ms, TTFT ms): "
                  + ", ".join(f"({sent:.0f}, {ttft:.0f})" for sent, ttft in p["slowest"]))
    result = {"layers": args.layers, "size": args.size, "device": args.device, "modes": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
