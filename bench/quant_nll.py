"""NLL of the tiny model on a fixed text: unquantized (fp32) vs bf16-rounded weights vs fp8 block
(128 and 16) vs nvfp4 experts, all written by `tpserve quantize` and run by tpserve's CPU
reference path (dequantize, matmul in fp32). Also the largest logit difference to fp32 and
whether the 16 greedy tokens after the first 32 text tokens agree.

Usage: python bench/quant_nll.py [--layers 8] [--png bench/results/quant_nll_cpu.png]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import prefill_logits  # noqa: E402

from tpserve import LLM, SamplingParams  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog. Serving a large mixture of experts model means "
        "moving weights from memory to the tensor cores as fast as the memory allows, and every bit "
        "saved in the weights is time saved at batch one. ") * 3


def _bf16_copy(src: Path, dst: Path) -> Path:
    import shutil

    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy2(f, dst / f.name)
    tensors = {k: (v.bfloat16().float() if v.is_floating_point() else v)
               for k, v in load_file(str(src / "model.safetensors")).items()}
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--png", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from tpserve.model.tiny import make_tiny
    from tpserve.tools.quantize import quantize_checkpoint

    root = Path(tempfile.mkdtemp(prefix="quant-nll-"))
    base = make_tiny(root / "fp32", seed=1, layers=args.layers)
    ids = AutoTokenizer.from_pretrained(str(base))(TEXT)["input_ids"]
    variants = {"fp32": base, "bf16 weights": _bf16_copy(base, root / "bf16"),
                "fp8 block 128": quantize_checkpoint(base, root / "fp8-128", "fp8", block=128),
                "fp8 block 16": quantize_checkpoint(base, root / "fp8-16", "fp8", block=16),
                "nvfp4 experts": quantize_checkpoint(base, root / "nvfp4", "nvfp4")}
    rows, ref_logits, ref_tokens = [], None, None
    for name, path in variants.items():
        llm = LLM(str(path), device="cpu", kv_cache_memory="64MiB", block_size=16, max_num_batched_tokens=512)
        logits = prefill_logits(llm, ids)
        nll = torch.nn.functional.cross_entropy(logits[:-1].double(), torch.tensor(ids[1:])).item()
        out = llm.generate([{"prompt_token_ids": ids[:32]}], SamplingParams(temperature=0, max_tokens=16,
                                                                            ignore_eos=True))
        tokens = out[0].outputs[0].token_ids
        if ref_logits is None:
            ref_logits, ref_tokens = logits, tokens
        rows.append({"weights": name, "nll": nll, "max_logit_diff": (logits - ref_logits).abs().max().item(),
                     "greedy_equal": sum(a == b for a, b in zip(tokens, ref_tokens))})
    print(f"tiny model: {args.layers} layers (make-tiny seed 1), {len(ids)} tokens of fixed text\n")
    print("| weights | NLL (nats/token) | max abs logit diff vs fp32 | greedy tokens equal to fp32 (of 16) |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['weights']} | {r['nll']:.4f} | {r['max_logit_diff']:.4f} | {r['greedy_equal']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.bar([r["weights"] for r in rows], [r["nll"] - rows[0]["nll"] for r in rows])
        ax.set_ylabel("NLL - NLL(fp32), nats/token")
        ax.set_title(f"tiny model ({args.layers} layers), {len(ids)} tokens of fixed text")
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
