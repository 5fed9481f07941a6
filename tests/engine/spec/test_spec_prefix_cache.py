"""Speculative decoding (MTP) with prefix caching on the tiny published-layout MTP checkpoint: a later turn resumes from the
cache (the drafter's cache rows of the shared blocks included) and its greedy tokens equal plain decoding's
without the cache; the fused graph steps (padded, eager on CPU) too."""

from spec_cases import Model

from tpserve import LLM, SamplingParams

SPEC = {"method": "mtp", "num_speculative_tokens": 3, "adaptive": False}
KW = dict(device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=4, max_num_batched_tokens=48)


def _turns(llm, sp):
    tok = llm.get_tokenizer()
    first = tok.encode("Count from 1 to 60: " + ", ".join(str(i) for i in range(1, 25)) + ",")
    other = tok.encode("Count from 1 to 60: " + ", ".join(str(i) for i in range(1, 25)) + "; now the letters: a, b,")
    outs = [llm.generate([{"prompt_token_ids": first}], sp)[0]]
    follow = first + outs[0].outputs[0].token_ids + tok.encode(" Again from 5: 5, 6,")
    outs += llm.generate([{"prompt_token_ids": follow}, {"prompt_token_ids": other}], sp)
    return [o.outputs[0].token_ids for o in outs], [o.num_cached_tokens for o in outs]


def test_spec_decoding_from_the_prefix_cache_gives_plain_tokens():
    sp = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = LLM(Model.path, enable_prefix_caching=False, **KW)
    want, none = _turns(plain, sp)
    assert none == [0, 0, 0]
    spec = LLM(Model.path, speculative_config=SPEC, **KW)
    got, cached = _turns(spec, sp)
    assert got == want
    assert cached[0] == 0 and cached[1] > 80 and cached[2] > 0  # the first turn's answer and its prompt
    stats = spec.engine.stats()
    assert stats["spec_decode_num_accepted_tokens"] > 0 and stats["prefix_cache_hits"] == sum(cached)
    e = spec.engine
    assert e.block_pool.num_free == e.block_pool.num_blocks and e.slot_pool.num_free == e.slot_pool.num_blocks
    # the fused speculative steps (acceptance, KDA commit and drafts on the device; padded graph steps on CPU)
    fused = LLM(Model.path, speculative_config=SPEC, **KW)
    fused.engine.executor.runner.setup_graphs(4, None, enforce_eager=False, pad_on_cpu=True,
                                              num_speculative_tokens=3, draft_graph="fused")
    assert _turns(fused, sp) == (got, cached)


def _skip_first_pass(llm, tok_ids, sp):
    """Serve tok_ids once with its prompt's MTP pass skipped: its cached blocks have no MTP rows."""
    drafter = llm.engine.speculator.drafter
    draft = drafter.draft
    drafter.draft = lambda scheduled, starts, k, explore, prompt_pass=None: draft(
        scheduled, starts, k, explore, lambda prompts: set())
    llm.generate([{"prompt_token_ids": tok_ids}], sp)
    drafter.draft = draft


def _served(llm, tok_ids, sp):
    """-> (output, whether it drafted)."""
    before = llm.engine.stats()["spec_decode_num_drafts"]
    out = llm.generate([{"prompt_token_ids": tok_ids}], sp)[0]
    return out, llm.engine.stats()["spec_decode_num_drafts"] > before


def test_a_hit_on_blocks_without_mtp_rows_computes_them_again_or_decodes_plainly():
    """A request that skipped its prompt's MTP pass leaves cached blocks whose drafter rows were never written. A
    later request that is to draft resumes only before them and computes them again, its pass included; its blocks
    replace the cached ones, so the next request resumes from the whole prompt and drafts. One that is not to draft
    (the speculator says recomputing does not pay) takes the whole hit and decodes plainly: drafts must not read
    rows never written. Tokens equal plain decoding's throughout."""
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = LLM(Model.path, enable_prefix_caching=False, **KW)
    tok_ids = plain.get_tokenizer().encode("Count from 1 to 60: " + ", ".join(str(i) for i in range(1, 25)) + ",")
    want = plain.generate([{"prompt_token_ids": tok_ids}], sp)[0].outputs[0].token_ids

    llm = LLM(Model.path, speculative_config=SPEC, **KW)  # a fixed k: recomputing is wanted
    _skip_first_pass(llm, tok_ids, sp)
    out, drafted = _served(llm, tok_ids, sp)
    assert out.num_cached_tokens == 0 and drafted and out.outputs[0].token_ids == want
    out, drafted = _served(llm, tok_ids, sp)
    assert out.num_cached_tokens >= 32 and drafted and out.outputs[0].token_ids == want
    e = llm.engine
    assert e.block_pool.num_free == e.block_pool.num_blocks

    llm = LLM(Model.path, speculative_config=SPEC, **KW)
    llm.engine.scheduler.mtp_wanted = lambda seq, start, hit: False
    _skip_first_pass(llm, tok_ids, sp)
    out, drafted = _served(llm, tok_ids, sp)
    assert out.num_cached_tokens >= 32 and not drafted and out.outputs[0].token_ids == want

    llm = LLM(Model.path, speculative_config=SPEC, **KW)  # the pass ran: the hit has MTP rows
    llm.generate([{"prompt_token_ids": tok_ids}], sp)
    out, drafted = _served(llm, tok_ids, sp)
    assert out.num_cached_tokens >= 32 and drafted and out.outputs[0].token_ids == want
