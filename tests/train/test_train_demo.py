"""train-demo: a few CPU steps at tiny size (seeded, resumable), the checkpoint layout with the MTP
layer, and the training forward being the same function as transformers and the engine."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import reference_greedy, reference_logits  # noqa: E402

SETTINGS = dict(preset="tiny", batch=2, seq_len=64, docs=120, vocab_size=320, warmup=5, save_every=1,
                save_dtype="float32", time_budget=0)


def _tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    from tpserve.train.settings import TrainSettings
    from tpserve.train.trainer import train

    out = tmp_path_factory.mktemp("demo") / "a"
    train(out, TrainSettings(steps=3, **SETTINGS), progress=False)
    return out


def test_seeded_and_resumable(trained, tmp_path):
    """2 steps, then resume to 3 == 3 steps in one go (warmup covers all steps: same learning rates)."""
    import shutil

    from tpserve.train.settings import TrainSettings
    from tpserve.train.trainer import train

    b = tmp_path / "b"
    b.mkdir()
    for name in ("data.xz", "data.json"):  # same corpus and tokenizer files, made once
        shutil.copy(trained / name, b / name)
    shutil.copytree(trained / "model", b / "model", ignore=shutil.ignore_patterns("model*", "train_info.json"))
    train(b, TrainSettings(steps=2, **SETTINGS), progress=False)
    assert torch.load(b / "state.pt", weights_only=False)["state"]["step"] == 2
    result = train(b, TrainSettings(steps=3, **SETTINGS), progress=False)
    assert result["steps"] == 3
    ta, tb = _tensors(trained / "model"), _tensors(b / "model")
    assert ta.keys() == tb.keys()
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name
    history = json.loads((trained / "losses.json").read_text())
    assert [h["step"] for h in history] == [0, 2] and all(math.isfinite(h["loss"]) for h in history)
    assert (trained / "loss.png").stat().st_size > 1000


def test_stop_after_ends_the_call_and_a_rerun_resumes(trained, tmp_path):
    """--stop-after: the call stops (state saved, checkpoint exported); running again finishes the
    same schedule, bit for bit (here the first call stops before its first step)."""
    import shutil

    from tpserve.train.settings import TrainSettings
    from tpserve.train.trainer import train

    b = tmp_path / "b"
    b.mkdir()
    for name in ("data.xz", "data.json"):
        shutil.copy(trained / name, b / name)
    shutil.copytree(trained / "model", b / "model", ignore=shutil.ignore_patterns("model*", "train_info.json"))
    first = train(b, TrainSettings(steps=3, stop_after=1e-9, **SETTINGS), progress=False)
    assert first["steps"] == 0 and (b / "model" / "config.json").is_file()
    assert train(b, TrainSettings(steps=3, **SETTINGS), progress=False)["steps"] == 3
    ta, tb = _tensors(trained / "model"), _tensors(b / "model")
    for name in ta:
        assert torch.equal(ta[name], tb[name]), name


def test_checkpoint_layout_has_the_mtp_layer(trained):
    """The MTP layer in the published layout (docs/checkpoints.md): layer N with enorm, hnorm, eh_proj, the
    MLA + indexer + MoE block and shared_head.norm, no hc_* tensors, no copies of the embedding or head;
    the same names and shapes make-tiny writes for that config (and so what the engine loads)."""
    from tpserve.model.config import ModelConfig
    from tpserve.model.tiny import random_state_dict

    cfg = json.loads((trained / "model" / "config.json").read_text())["text_config"]
    n, d = cfg["num_hidden_layers"], cfg["hidden_size"]
    assert cfg["num_nextn_predict_layers"] == 1
    t = _tensors(trained / "model")
    p = f"model.language_model.layers.{n}."
    assert t[p + "eh_proj.weight"].shape == (d, 2 * d)
    for name in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight", "self_attn.kv_b_proj.weight",
                 "self_attn.indexer.wk.weight", "mlp.gate.weight", "mlp.experts.0.gate_proj.weight",
                 "mlp.shared_experts.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"):
        assert p + name in t, name
    mtp = {k for k in t if k.startswith(p)}
    assert not any(".hc_" in k or "embed_tokens" in k or "shared_head.head" in k for k in mtp)
    assert not any(k.startswith(f"model.language_model.layers.{n + 1}.") for k in t)
    want = random_state_dict(ModelConfig.from_file(trained / "model"), 0, mtp=True)
    assert {k: tuple(v.shape) for k, v in t.items()} == {k: tuple(v.shape) for k, v in want.items()}
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (trained / "model" / f).is_file()


def test_a_word_is_the_same_tokens_after_a_space_a_quote_or_a_tag(tmp_path):
    """Names are copied from the prompt (user text, the tools' JSON) into tool calls: a tokenizer
    trained on text where the name mostly follows a space must give it the same ids wherever it
    stands, and still decode to the text."""
    from transformers import AutoTokenizer

    from tpserve.train.tokenizer import train_tokenizer, write_tokenizer

    texts = ["Please use notify_address now, then notify_address again."] * 50 + ['{"name": "notify_address"}']
    write_tokenizer(train_tokenizer(texts, 400), tmp_path, model_max_length=64)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    word = tok.encode("notify_address", add_special_tokens=False)
    assert len(word) <= 3  # merged into word pieces, not bytes
    for text in ("Use notify_address", '{"name": "notify_address"', "<tool_call>notify_address"):
        ids = tok.encode(text, add_special_tokens=False)
        assert any(ids[i:i + len(word)] == word for i in range(len(ids))), text
        assert tok.decode(ids) == text
    assert tok.decode(tok.encode("a  b 12, x", add_special_tokens=False)) == "a  b 12, x"


def test_training_forward_matches_transformers_and_engine(trained):
    """Logits of our training forward == transformers' (fp32 rounding), and the engine's greedy
    tokens == transformers' greedy tokens, on the checkpoint train-demo wrote."""
    from tpserve import LLM, SamplingParams
    from tpserve.model.config import ModelConfig
    from tpserve.train.model import TrainModel, load_checkpoint_

    path = trained / "model"
    cfg = ModelConfig.from_file(path)
    model = TrainModel(cfg)
    load_checkpoint_(model, path)
    prompt = torch.randint(3, cfg.vocab_size - 20, (90,), generator=torch.Generator().manual_seed(4)).tolist()
    with torch.no_grad():
        ours = model(torch.tensor([prompt])).logits[0]
    ref = reference_logits(path, prompt)
    # fp32: each layer's dot products (length <= hidden * hc_mult) round at ~eps * sqrt(length)
    # relative; errors add over the layers and the mHC / Sinkhorn steps of each
    eps = torch.finfo(torch.float32).eps
    steps = 2 * cfg.num_hidden_layers * (cfg.hc_sinkhorn_iters + 4)
    bound = eps * math.sqrt(cfg.hidden_size * cfg.hc_mult) * steps * ref.abs().max().item()
    err = (ours - ref).abs().max().item()
    assert err <= bound, (err, bound)

    llm = LLM(str(path), device="cpu", dtype="float32", kv_cache_memory="8MiB", block_size=16)
    got = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    llm.shutdown()
    assert got[0].outputs[0].token_ids == reference_greedy(path, prompt, 12)


def test_mtp_draft_loop_runs(trained):
    from tpserve.model.config import ModelConfig
    from tpserve.train.mtp_eval import draft_and_verify
    from tpserve.train.model import TrainModel, load_checkpoint_

    path = trained / "model"
    model = TrainModel(ModelConfig.from_file(path))
    load_checkpoint_(model, path)
    # 12 + 6 tokens: every position keeps all the pools it sees (index_topk 16 = 4 pools of 4), so no discrete
    # selection turns the rounding of forwards of other lengths into another token (a near-untrained indexer's
    # scores tie, many at relu's zero)
    prompt = list(range(5, 17))
    stats = draft_and_verify(model, prompt, max_new_tokens=6, k=3)
    assert stats["drafted"] >= 3 and 0 <= stats["accepted"] <= stats["drafted"]
    # the loop's output is the model's own greedy continuation, drafts or not
    assert stats["tokens"] == draft_and_verify(model, prompt, max_new_tokens=6, k=0)["tokens"]


def test_dense_moe_equals_the_expert_loop():
    """The dense MoE form (every expert over every token, zero weights off the chosen ones) gives
    the loop's output and gradients: both sum the same two contributions; only the matmuls'
    blocking differs, so the bound is a few fp32 ulps of the D-term dot products."""
    from tpserve.model.config import ModelConfig
    from tpserve.train import presets
    from tpserve.train.model import TrainModel, init_weights_

    cfg = ModelConfig.from_dict(presets.config_dict("tiny", 320, [1], 0))
    outs = []
    for dense in (False, True):
        model = TrainModel(cfg, mtp=True, dense_moe=dense)
        init_weights_(model, 0)
        ids = torch.randint(0, 320, (2, 48), generator=torch.Generator().manual_seed(1))
        out = model(ids, mtp_depths=2)
        loss = out.logits.logsumexp(-1).mean() + sum(m.logsumexp(-1).mean() for m in out.mtp_logits)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        outs.append((out.logits.detach(), grads))
    (la, ga), (lb, gb) = outs
    assert ga.keys() == gb.keys() and any("experts" in n for n in ga)
    eps = torch.finfo(torch.float32).eps
    scale = la.abs().max()
    assert (la - lb).abs().max() <= 64 * cfg.hidden_size * eps * scale
    for name in ga:
        bound = 64 * cfg.hidden_size * eps * max(ga[name].abs().max(), 1e-3)
        assert (ga[name] - gb[name]).abs().max() <= bound, name


def test_training_tools_never_use_held_out_names():
    """The acceptance check's tools (new names and argument names) never name a training tool;
    training tools come in four name styles (word list, made-up words, stdlib identifiers, docstring
    words)."""
    import random

    from tpserve.train import corpus
    from tpserve.tools.acceptance import held_out_tool_cases

    held_parts = set()
    for case in held_out_tool_cases():
        for tool in case["tools"]:
            fn = tool["function"]
            held_parts.update(p for p in fn["name"].split("_") if corpus.is_held_out(p))
            for arg in fn["parameters"]["properties"]:
                held_parts.update(p for p in arg.split("_") if corpus.is_held_out(p))
    assert held_parts
    rng = random.Random(0)
    names = set()
    for _ in range(600):
        fn = corpus.make_tool(rng, held_out=False)["function"]
        parts = fn["name"].split("_") + [p for a in fn["parameters"]["properties"] for p in a.split("_")]
        assert not set(parts) & held_parts, fn
        names.add(fn["name"])
    idents = set(corpus.stdlib_identifiers())
    assert len(idents) > 500 and names & idents
    assert any(n.split("_")[0] not in corpus.VERBS and n not in idents for n in names)  # made-up words
    doc = set(corpus.stdlib_words())
    assert len(doc) > 1000 and any(set(n.split("_")) <= doc - set(corpus.VERBS + corpus.NOUNS) for n in names)


def test_counting_documents_stop_at_round_targets():
    """Users ask for round targets; a count crossing 100 or 200 without stopping must not be all the
    model sees there (else it counts on past exactly 100 and 200)."""
    import random
    import re

    from tpserve.train import corpus

    rng = random.Random(0)
    stops: dict[int, int] = {}
    for _ in range(3000):
        m = re.search(r"from 1 to (\d+)", corpus.counting(rng))
        if m:
            stops[int(m.group(1))] = stops.get(int(m.group(1)), 0) + 1
    assert stops.get(100, 0) >= 10 and stops.get(200, 0) >= 10, (stops.get(100), stops.get(200))
