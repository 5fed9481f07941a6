"""hf_overrides (vLLM's name): model config fields replaced at load; num_hidden_layers runs the
checkpoint's first N layers (benchmarks of a model cut to what fits), checked against transformers
on a copy of the checkpoint whose config says N layers."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import reference_greedy  # noqa: E402


def _cut_copy(src: Path, dst: Path, n: int) -> Path:
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    text = raw.get("text_config", raw)
    text["num_hidden_layers"] = n
    for key in ("layer_types", "mlp_layer_types", "indexer_types"):
        if text.get(key):
            text[key] = text[key][:n]
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


def test_num_hidden_layers_override_equals_a_cut_checkpoint(tiny, tmp_path):
    from tpserve import LLM, SamplingParams

    src = tiny("default")  # 8 layers: KDA x3 + MLA, twice; the cut keeps an MLA layer and MoE layers
    prompt = [5, 17, 99, 3, 250, 41, 8]
    want = reference_greedy(_cut_copy(src, tmp_path / "cut", 5), prompt, 12)
    llm = LLM(str(src), device="cpu", kv_cache_memory="16MiB", block_size=16, hf_overrides={"num_hidden_layers": 5})
    assert llm.engine.model_config.num_hidden_layers == 5
    assert len(llm.engine.model_config.layer_types) == 5
    got = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=12))[0]
    llm.shutdown()
    assert list(got.outputs[0].token_ids) == want
    full = reference_greedy(src, prompt, 12)
    assert full != want  # the cut model is a different model: the override did take effect


@pytest.mark.parametrize("overrides,match", [
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"num_hidden_layers": 9}, r"num_hidden_layers: an integer in \[1, 8\]"),
    ({"num_hidden_layers": "4"}, "num_hidden_layers"),
    ({"no_such_field": 1}, "no_such_field"),
])
def test_bad_overrides_name_the_field(tiny, overrides, match):
    from tpserve import LLM

    with pytest.raises(ValueError, match=match):
        LLM(str(tiny("default")), device="cpu", kv_cache_memory="16MiB", hf_overrides=overrides)


@pytest.mark.parametrize("raw,match", [("{not json", "hf_overrides: not valid JSON"),
                                       ("[1, 2]", "hf_overrides: expected a JSON object")])
def test_bad_json_is_refused_at_construction(raw, match):
    from tpserve.config import EngineConfig

    with pytest.raises(ValueError, match=match):
        EngineConfig(hf_overrides=raw)


def test_cut_layers_and_speculation_are_refused_together():
    from tpserve.config import EngineConfig

    with pytest.raises(ValueError, match="hf_overrides: num_hidden_layers cannot be combined"):
        EngineConfig(hf_overrides={"num_hidden_layers": 2},
                     speculative_config={"method": "mtp", "num_speculative_tokens": 2})
