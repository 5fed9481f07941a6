"""Write CONFIG, the real-width checkpoint folder the serving benchmarks load with `--load-format dummy`: the config
of `tpserve bench model --layers L` (real widths, random weights made at load) with a byte-level BPE tokenizer of the
model's 154,880 ids and the GLM chat template (model/tiny_tokenizer.py), its end tokens in the config.

    python bench/real_config.py DIR [--layers KKKM] [--mtp]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tpserve.model.tiny_tokenizer import write_tiny_tokenizer
from tpserve.tools.bench.model import real_width_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--layers", default="KKKM", help="K (KDA) and M (MLA) layers, as bench model's --layers")
    ap.add_argument("--mtp", action="store_true", help="add the MTP layer (num_nextn_predict_layers 1)")
    args = ap.parse_args()
    cfg = real_width_config(args.layers, False, mtp=args.mtp)
    text = cfg["text_config"]
    out = Path(args.dir)
    tok = write_tiny_tokenizer(out, 154880)
    text["eos_token_id"], text["pad_token_id"] = list(tok["eos_token_id"]), tok["pad_token_id"]
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    gen = {"eos_token_id": text["eos_token_id"], "pad_token_id": text["pad_token_id"], "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen))
    print(f"wrote {out}: {args.layers}{' + MTP' if args.mtp else ''}, {tok['num_tokens']} tokens")


if __name__ == "__main__":
    main()
