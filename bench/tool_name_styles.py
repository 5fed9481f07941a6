"""Which tool names a demo model copies into its calls, by naming style: training-style tools named
from the word lists, with made-up words, with standard-library identifiers, and the held-out tools
of the acceptance check (words never used in training tool names). Greedy, CPU, float32; counts the
calls whose name is exactly the one the user asked for.

    python bench/tool_name_styles.py [--model DIR] [--n 20]
"""

import argparse
import random
import re

from tpserve import LLM, SamplingParams
from tpserve.train import corpus
from tpserve.tools.acceptance import builtin_dir

STYLES = {"word lists": 0.999, "made-up words": 0.0, "identifiers": corpus.PSEUDO_NAMES,
          "docstring words": corpus.PSEUDO_NAMES + corpus.IDENTIFIER_NAMES, "held out": None}


def cases(style: str, n: int, seed: int = 123) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        held = style == "held out"
        tools = [corpus.make_tool(rng, held, None if held else STYLES[style]) for _ in range(rng.randint(1, 3))]
        tool = rng.choice(tools)
        args = corpus.tool_arguments(rng, tool)
        out.append({"tools": tools, "name": tool["function"]["name"], "thinking": rng.random() < 0.5,
                    "user": corpus.tool_request(rng, tool["function"]["name"], args)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(builtin_dir()))
    ap.add_argument("--n", type=int, default=20)
    args = ap.parse_args()
    llm = LLM(args.model, device="cpu", dtype="float32")
    sp = SamplingParams(temperature=0, max_tokens=120)
    print("| naming style | name copied right | examples of misses (wanted -> written) |\n| --- | --- | --- |")
    for style in STYLES:
        right, misses = 0, []
        for c in cases(style, args.n):
            text = llm.chat([{"role": "user", "content": c["user"]}], sp, tools=c["tools"],
                            chat_template_kwargs={"enable_thinking": c["thinking"]})[0].outputs[0].text
            m = re.search(r"<tool_call>([^<\n]*)", text)
            got = m.group(1).strip() if m else None
            right += got == c["name"]
            if got != c["name"] and len(misses) < 3:
                misses.append(f"{c['name']} -> {got}")
        print(f"| {style} | {right}/{args.n} | {'; '.join(misses)} |", flush=True)
    llm.shutdown()


if __name__ == "__main__":
    main()
