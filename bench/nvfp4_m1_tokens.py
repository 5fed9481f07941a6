"""Greedy tokens of real-width layers with NVFP4 experts (random weights made on the GPU, the same seed each boot)
under --quant-gemv-backend triton and cuda: the engine's MoE at decode runs the grouped Triton experts in one and
kernels/nvfp4_m1.py in the other (batches up to quant_ops.M1_MAX_TOKENS), so the two differ in fp32 summation
order only. Prints how many prompts decode the same tokens, and the first position where each differs.

    python bench/nvfp4_m1_tokens.py [--layers KKKM] [--prompts 8] [--max-tokens 32] [--json F]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from tpserve import LLM, SamplingParams
from tpserve.tools.bench_model import real_width_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="KKKM")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cfg = real_width_config(args.layers, dense_first=False)
    gen = torch.Generator().manual_seed(0)
    vocab = 154880
    prompts = [{"prompt_token_ids": torch.randint(0, vocab, (int(n),), generator=gen).tolist()}
               for n in torch.randint(16, 200, (args.prompts,), generator=gen)]
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    tokens = {}
    with tempfile.TemporaryDirectory(prefix="tpserve-m1-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(cfg))
        for backend in ("triton", "cuda"):
            llm = LLM(tmp, device="cuda", load_format="dummy", skip_tokenizer_init=True, quantization="nvfp4",
                      quant_gemv_backend=backend, kv_cache_memory=4 * 2**30, max_num_seqs=args.prompts)
            tokens[backend] = [r.outputs[0].token_ids for r in llm.generate(prompts, sp)]
            llm.shutdown()
    same = sum(a == b for a, b in zip(tokens["triton"], tokens["cuda"]))
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
             for a, b in zip(tokens["triton"], tokens["cuda"])]
    print(f"layers {args.layers}, NVFP4 experts, batch {args.prompts}: {same}/{len(prompts)} prompts the same "
          f"{args.max_tokens} greedy tokens under triton and cuda; first differing position per prompt: {first}",
          flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(same=same, prompts=len(prompts), first_diff=first,
                                                   tokens=tokens), indent=1))


if __name__ == "__main__":
    main()
