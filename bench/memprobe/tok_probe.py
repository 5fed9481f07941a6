"""The server's per-request CPU work without HTTP or the engine: render the chat template of a
random soak message and encode it, N times; glibc heap in use every N/10. argv: N mode"""
import random, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from soak_probe_lib import heap, rss
from transformers import AutoTokenizer
from tpserve.server.chat import apply_chat_template

tok = AutoTokenizer.from_pretrained(__import__("os").environ.get("TINY_DIR", "/tmp/tpc_soak/tiny-glm5-next-v1"))
n, mode = int(sys.argv[1]), sys.argv[2]
rng = random.Random(0)
print(type(tok).__name__, "vocab", len(tok))
for i in range(n + 1):
    text = f"soak {rng.random()}"
    if mode in ("template", "both"):
        text = apply_chat_template(tok, [{"role": "user", "content": text}], None)
    if mode in ("encode", "both", "template"):
        ids = tok.encode(text, add_special_tokens=False)
    if i % (n // 10) == 0:
        h = heap()
        print(f"{i:7d} rss {rss():7.1f} in_use {h['heap_in_use']:7.2f} free {h['heap_free']:6.2f} arena {h['arena']:7.1f}")
