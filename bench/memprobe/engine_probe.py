"""The soak's load on the LLMEngine alone (no server, no HTTP): 64 requests in flight, random
prompts (1-48 ids), 1..MAX_TOKENS new tokens, ignore_eos, temperature 0 / 0.8, 10% aborted after
1-4 steps. Samples RSS and glibc mallinfo2 every 5 s. argv: duration max_tokens out.json"""
import json, random, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from soak_probe_lib import heap, rss  # noqa: E402
from tpserve.cli import build_parser
from tpserve.tools.common import engine_config_from_args
from tpserve.engine.engine import LLMEngine
from tpserve.sampling_params import SamplingParams

duration, max_tokens, out = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
args = build_parser().parse_args(["bench", "soak", "--device", "cpu", "--kv-cache-memory", "64MiB"])
eng = LLMEngine(engine_config_from_args(args))
rng = random.Random(0)
live, done, aborted, k = {}, 0, 0, 0
t0 = time.monotonic(); samples = []; next_sample = t0
while time.monotonic() - t0 < duration:
    while len(live) < 64:
        k += 1
        rid = f"r{k}"
        p = SamplingParams(max_tokens=rng.randint(1, max_tokens), ignore_eos=True, temperature=rng.choice([0, 0.8]))
        eng.add_request(rid, [rng.randint(3, 250) for _ in range(rng.randint(1, 48))], p)
        live[rid] = rng.randint(1, 4) if rng.random() < 0.1 else None
    for o in eng.step():
        if o.finished:
            live.pop(o.request_id, None); done += 1
        elif live.get(o.request_id) is not None:
            live[o.request_id] -= 1
            if live[o.request_id] <= 0:
                eng.abort(o.request_id); live.pop(o.request_id); aborted += 1
    now = time.monotonic()
    if now >= next_sample:
        samples.append({"t": now - t0, "rss": rss(), **heap(), "threads": 9, "done": done})
        next_sample += 5
json.dump({"rc": 0, "trim": 0.0, "samples": samples, "done": done, "aborted": aborted}, open(out, "w"))
print("done", done, "aborted", aborted)
