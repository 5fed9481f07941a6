"""The MTP drafter (model/mtp.py) against a direct torch transcription of vLLM's Glm5NextMTP forward
(docs/checkpoints.md): the row at position p takes embed(token p+1), zeroed at position 0, and the
model's hidden at p after the mean of the mHC streams and the final norm (transformers' last hidden
state here, the oracle); x = eh_proj(cat[enorm(e), hnorm(h)]) with both norms in fp32; a plain-residual
MLA + MoE block; out = shared_head.norm(y + r) is both the LM head's input and the next depth's hidden.
transformers has no MTP layer, so this transcription is the check. The attention and MoE inside the
block are train/'s forwards of the same weights (tests/train checks them against transformers)."""

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from helpers import reference_model
from tpserve import LLM
from tpserve.engine.runner import StepPlan

SPEC = {"method": "mtp", "num_speculative_tokens": 2, "adaptive": False}


def _vllm_rms(x, weight, eps, residual=None):
    """vLLM's RMSNorm.forward_native (with the fused residual add): -> (normed, new residual)."""
    dtype = x.dtype
    x = x.float()
    if residual is not None:
        x = x + residual.float()
        residual = x.to(dtype)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x.to(dtype) * weight, residual


def _fused_eh_norm(positions, embeds, prev, enorm_w, hnorm_w, eps, zero_pos0=True, swap=False):
    """vLLM nvidia/ops/fused_eh_norm.py: e zeroed where position == 0, both halves normed and scaled in
    fp32 (fp32 weights), written as [enorm(e) | hnorm(h)] in the input dtype."""
    e = embeds.float()
    if zero_pos0:
        e = torch.where((positions == 0).unsqueeze(-1), 0.0, e)

    def norm(v, w):
        v = v.float()
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w.float()

    halves = [norm(e, enorm_w), norm(prev, hnorm_w)]
    return torch.cat(halves[::-1] if swap else halves, dim=-1).to(embeds.dtype)


class Recipe:
    """vLLM's Glm5NextMultiTokenPredictorLayer.forward over whole sequences, on a checkpoint's layer N."""

    def __init__(self, path, cfg):
        from tpserve.train.model import TrainModel, load_checkpoint_

        self.train = TrainModel(cfg)
        load_checkpoint_(self.train, path)
        t = load_file(str(path / "model.safetensors"))
        n = cfg.num_hidden_layers
        self.w = {k.split(f"layers.{n}.", 1)[1]: v for k, v in t.items() if f".layers.{n}." in k}
        self.embed, self.head = t["model.language_model.embed_tokens.weight"], t["lm_head.weight"]
        self.eps = cfg.rms_norm_eps

    @torch.no_grad()
    def layer(self, positions, ids, prev, zero_pos0=True, swap=False):
        """rows [T] (positions, token ids of p+1, previous hidden [T, D]) -> the layer's output [T, D] and the
        sum shared_head.norm normalises; causal attention over the rows given, as the MTP cache holds them."""
        from tpserve.train import attention, blocks

        w, mtp = self.w, self.train.mtp
        eh = _fused_eh_norm(positions, F.embedding(ids, self.embed), prev, w["enorm.weight"], w["hnorm.weight"],
                            self.eps, zero_pos0, swap)
        hidden = F.linear(eh, w["eh_proj.weight"])
        residual = hidden  # mtp_block: the decoder layer's plain-residual path (no mHC on the MTP layer)
        hidden, _ = _vllm_rms(hidden, w["input_layernorm.weight"], self.eps)
        attn, _, _ = attention.mla(mtp.self_attn, hidden.unsqueeze(0), None, False)
        hidden, residual = _vllm_rms(attn[0], w["post_attention_layernorm.weight"], self.eps, residual)
        hidden = blocks.moe(mtp.mlp, hidden.unsqueeze(0))[0]
        return _vllm_rms(hidden, w["shared_head.norm.weight"], self.eps, residual)

    def logits(self, out):
        return F.linear(out, self.head)


@pytest.fixture(scope="module")
def setup(tiny):
    path = tiny("mtp_random")
    llm = LLM(str(path), device="cpu", kv_cache_memory="16MiB", block_size=16, skip_tokenizer_init=True,
              speculative_config=SPEC)
    yield path, llm
    llm.shutdown()


def _engine_depths(llm, ids):
    """The engine's drafter on `ids`: the catch-up over positions 0..n-2 (the main model's hidden), then one
    chained depth at position n-1 fed the catch-up's last output and its greedy draft. -> (main model's
    hidden [n, D], depth-1 logits [n-1, V], the draft, depth-2 logits [1, V])."""
    eng = llm.engine
    runner, n = eng.executor.runner, len(ids)
    blocks, slot = eng.block_pool.allocate(-(-n // 16)), eng.slot_pool.allocate(1)[0]
    try:
        runner.execute(StepPlan(ids, list(range(n)), [0, n], [0], [slot], [blocks], [n - 1], [slot]))
        main_hidden = runner.last_hidden.clone()
        rows = list(range(n - 1))
        d1 = runner.draft(StepPlan(ids[1:], rows, [0, n - 1], [0], [slot], [blocks], rows, []), rows, True).logits
        draft = int(d1[-1].argmax())
        d2 = runner.draft(StepPlan([draft], [n - 1], [0, 1], [n - 1], [slot], [blocks], [0], []), [n - 2], False)
    finally:
        eng.block_pool.free(blocks)
        eng.slot_pool.free([slot])
    return main_hidden, d1, draft, d2.logits


def test_drafter_follows_the_vllm_recipe(setup):
    path, llm = setup
    cfg = llm.engine.model_config
    ids = torch.randint(3, cfg.vocab_size, (37,), generator=torch.Generator().manual_seed(7)).tolist()
    n = len(ids)
    main_hidden, got1, draft, got2 = _engine_depths(llm, ids)
    with torch.no_grad():  # the trunk's hidden: transformers' last hidden state (norm of the streams' mean)
        h = reference_model(str(path)).model.language_model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    assert (main_hidden - h).abs().max() < 1e-4 * h.abs().max()
    rec = Recipe(path, cfg)
    pos, tok = torch.arange(n - 1), torch.tensor(ids[1:])
    out1, sum1 = rec.layer(pos, tok, h[:n - 1])
    want1 = rec.logits(out1)
    bound = 1e-4 * want1.abs().max().item()
    assert (got1 - want1).abs().max().item() < bound
    assert draft == int(want1[-1].argmax())
    # depth 2 at position n-1: the draft's embedding and depth 1's *normed* output; its attention sees the
    # MTP cache rows 0..n-2 that depth 1 wrote, and itself
    pos2, tok2 = torch.arange(n), torch.tensor(ids[1:] + [draft])
    out2, _ = rec.layer(pos2, tok2, torch.cat([h[:n - 1], out1[-1:]]))
    want2 = rec.logits(out2[-1:])
    assert (got2 - want2).abs().max().item() < bound
    assert torch.equal(out2[:n - 1], out1)  # (causal: the depth-1 rows are what depth 1 computed)

    # each part of the recipe moves the drafts: a drafter without it would fail the checks above
    no_zero = rec.logits(rec.layer(pos, tok, h[:n - 1], zero_pos0=False)[0])
    assert (no_zero[0] - want1[0]).abs().max().item() > 100 * bound  # row 0 is position 0
    swapped = rec.logits(rec.layer(pos, tok, h[:n - 1], swap=True)[0])
    assert (swapped - want1).abs().max().item() > 100 * bound
    unnormed = rec.logits(rec.layer(pos2, tok2, torch.cat([h[:n - 1], sum1[-1:]]))[0][-1:])
    assert (unnormed - want2).abs().max().item() > 100 * bound


def test_a_catch_up_runs_the_moe_on_its_logits_rows_only(setup):
    """A prompt's catch-up wants the last row's draft: every row writes the MTP cache, the MoE runs on that
    row alone, and its logits are the recipe's (which runs the MoE on every row)."""
    path, llm = setup
    cfg, eng = llm.engine.model_config, llm.engine
    runner = eng.executor.runner
    ids = torch.randint(3, cfg.vocab_size, (29,), generator=torch.Generator().manual_seed(9)).tolist()
    n = len(ids)
    moe_rows, forward = [], runner.model.mtp.mlp.forward

    def spy(x, *a, **kw):
        moe_rows.append(x.shape[0])
        return forward(x, *a, **kw)

    blocks, slot = eng.block_pool.allocate(-(-n // 16)), eng.slot_pool.allocate(1)[0]
    runner.model.mtp.mlp.forward = spy
    try:
        runner.execute(StepPlan(ids, list(range(n)), [0, n], [0], [slot], [blocks], [n - 1], [slot]))
        h = runner.last_hidden.clone()
        rows = list(range(n - 1))
        got = runner.draft(StepPlan(ids[1:], rows, [0, n - 1], [0], [slot], [blocks], [n - 2], []), rows, True)
    finally:
        del runner.model.mtp.mlp.forward
        eng.block_pool.free(blocks)
        eng.slot_pool.free([slot])
    assert moe_rows == [1]
    rec = Recipe(path, cfg)
    want = rec.logits(rec.layer(torch.arange(n - 1), torch.tensor(ids[1:]), h[:n - 1])[0][-1:])
    assert (got.logits - want).abs().max().item() < 1e-4 * want.abs().max().item()


def test_training_forward_is_the_same_recipe(setup):
    """train/model.py's MTP step (what `tpserve train-demo` trains) at depths 1 and 2 against the
    transcription, over whole sequences (depth 2's rows at positions 1.. keep their embeddings)."""
    path, llm = setup
    cfg = llm.engine.model_config
    rec = Recipe(path, cfg)
    ids = torch.randint(3, cfg.vocab_size, (1, 30), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        out = rec.train(ids, mtp_depths=2)
        h = out.hidden[0]
        out1, _ = rec.layer(torch.arange(30), torch.roll(ids, -1, dims=1)[0], h)
        out2, _ = rec.layer(torch.arange(1, 31), torch.roll(ids, -2, dims=1)[0], out1)
    for got, want in ((out.mtp_logits[0][0], rec.logits(out1)), (out.mtp_logits[1][0], rec.logits(out2))):
        assert (got - want).abs().max().item() < 1e-4 * want.abs().max().item()


def test_eh_norms_scale_in_fp32():
    """enorm / hnorm multiply by the weight in fp32 and round once (vLLM's fused_eh_norm), where the block's
    norms round, then scale in the activation dtype (transformers' RMSNorm): they differ in bf16."""
    from tpserve.model.layers import RMSNorm, ShardContext
    from tpserve.model.mtp import norm_fp32

    norm = RMSNorm(ShardContext.single(torch.bfloat16), 256, 1e-5)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(256, generator=g))
    x = torch.randn(64, 256, generator=g).to(torch.bfloat16)
    h = x.float()
    want = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.float()).to(torch.bfloat16)
    assert torch.equal(norm_fp32(x, norm), want)
    assert not torch.equal(norm(x), want)
