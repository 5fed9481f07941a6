"""`tpserve bench spec`: its step timer and one small run on a tiny checkpoint with an MTP layer in the
published layout (tests/helpers.py "mtp")."""

import json
import time


def test_step_times_mark_the_prefill_steps(tiny):
    from tpserve import LLM, SamplingParams
    from tpserve.tools.bench.spec import step_times

    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for async_scheduling in (False, True):
        llm = LLM(str(tiny("default")), device="cpu", kv_cache_memory="8MiB", async_scheduling=async_scheduling)
        with step_times(llm.engine) as steps:
            llm.generate("one two three", sp)
        # the prefill step emits the first token, three decode steps the rest (with async scheduling a decode
        # step's token counts at its launch, and a last call lands the step in flight); then the engine is as
        # before
        want = [(True, 1), (False, 1), (False, 1), (False, 1)] + ([(False, 0)] if async_scheduling else [])
        assert [(s.prefill, s.tokens) for s in steps] == want
        assert all(s.seqs == 1 for s in steps)  # (the landing call: the step in flight's)
        assert all(s.seconds > 0 and not s.drafted for s in steps)
        assert "step" not in vars(llm.engine) and "schedule" not in vars(llm.engine.scheduler)
        assert all(s.probe_seconds == 0 and s.state is None for s in steps)
        with step_times(llm.engine, lambda: time.sleep(0.01) or {"k": 1}) as steps:  # (a probe's own time)
            llm.generate("one two three", sp)
        assert all(s.state == {"k": 1} and s.probe_seconds >= 0.01 for s in steps)
        llm.shutdown()


def test_bench_spec_small_run(tiny, tmp_path, capsys, monkeypatch):
    import tpserve.tools.bench.spec as bench
    from tpserve.cli import main

    state = bench.adaptive_state  # the trace's probe, made slow: its time stays out of the timed calls
    monkeypatch.setattr(bench, "adaptive_state", lambda engine: time.sleep(0.05) or state(engine))

    out = tmp_path / "spec.json"
    trace = tmp_path / "trace.jsonl"
    rc = main(["bench", "spec", "--model", str(tiny("mtp")), "--device", "cpu", "--batch", "1", "--k", "1",
               "--max-tokens", "4", "--repeats", "1", "--json", str(out), "--trace", str(trace)])
    res = json.loads(out.read_text())
    assert rc == 0
    assert [r["setting"] for r in res["rows"]] == ["off", "k=1", "adaptive (k<=1)"]
    for r in res["rows"]:
        assert r["outputs_equal"] == r["outputs"] == res["prompts"]  # float32: speculation is exact
        assert r["tok_s"] > 0 and r["decode_tok_s"] > 0
        ms = r["ms_per_call"]  # the split adds up to the timed run: calls x (prefill + decode + outside)
        assert ms["prefill"] > 0 and ms["decode"] > 0 and ms["outside"] >= 0
        assert abs(res["prompts"] * sum(ms.values()) / 1e3 - r["seconds"]) < 1e-6 * r["seconds"] + 1e-9
    off = res["rows"][0]
    assert off["speedup"] == off["decode_speedup"] == 1.0
    assert [r["measured_rates"] is None for r in res["rows"]] == [True, True, False]  # adaptive k's own rates
    assert all(v["steps"] > 0 and v["tok_s"] > 0 for v in res["rows"][2]["measured_rates"].values())
    passes = res["rows"][2]["prompt_passes"]  # the timed run's prompts each asked the pay-back rule
    assert passes["ran"] + passes["skipped"] == res["prompts"] and passes["measured"] >= 1
    printed = capsys.readouterr().out
    assert "| decode tok/s | decode speedup |" in printed and "| ms a call: prefill / decode / outside |" in printed
    assert "adaptive k's own measurements at batch 1: batch<=1 " in printed
    assert "adaptive k's prompts at batch 1 (timed runs): MTP pass run " in printed
    # the decode steps, those that verified drafts and the others, as the bench timed them
    for r in res["rows"]:
        modes = r["decode_modes"]
        assert modes["spec"]["tokens"] + modes["plain"]["tokens"] > 0
        verified = modes["spec"]["steps"] > 0
        assert verified == (r["mean_accepted_length"] is not None)
        if r["setting"] == "off":
            assert not verified
        elif r["setting"].startswith("k="):  # (adaptive k drafts or not as its own timings have it)
            assert verified
    # at batch 1, request by request: drafting steps, their tokens, plain steps (every request's 3 tokens after
    # its prefill step's)
    assert res["rows"][0]["per_request"] is None
    for r in res["rows"][1:]:
        assert len(r["per_request"]) == res["prompts"] and all(t + p == 3 for _, t, p in r["per_request"])
        assert sum(d for d, _, _ in r["per_request"]) == r["decode_modes"]["spec"]["steps"]
    assert "k=1 at batch 1, request by request (its best timed run; drafting steps / their tokens / plain steps): " \
        in printed
    assert "its decode steps of batch <= 1 timed from outside the engine: " in printed
    assert "; without the speculator: plain " in printed
    # --trace: adaptive k's timed steps only, one line each, the prompt passes counted as the row has them
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    assert {s["setting"] for s in steps} == {"adaptive (k<=1)"}
    assert [s["step"] for s in steps] == list(range(len(steps)))
    adaptive = res["rows"][2]
    assert sum(s["tokens"] for s in steps) == res["prompts"] * 4
    assert sum(s["drafted"] and not s["prefill"] for s in steps) == adaptive["decode_modes"]["spec"]["steps"]
    asked = [s["passes_ran"] + s["passes_skipped"] for s in steps]  # (the first step's prompt asked in it)
    assert steps[0]["prefill"] and asked[-1] - asked[0] == passes["ran"] + passes["skipped"] - 1
    assert all(s["next_k"] in (0, 1) and isinstance(s["rates"], dict) for s in steps)
    assert adaptive["ms_per_call"]["outside"] < 50  # (each call has 4 or more probed steps)


def test_bench_spec_alternates_the_settings_timed_runs(tiny, monkeypatch):
    """Every setting's engine lives through the run and their timed runs alternate (off, adaptive, off, adaptive),
    so a drift during the run does not fall on one setting."""
    import tpserve.tools.bench.spec as bench
    from tpserve.cli import main

    timed, step_times = [], bench.step_times
    monkeypatch.setattr(bench, "step_times",
                        lambda engine, probe=None: timed.append(engine) or step_times(engine, probe))
    assert main(["bench", "spec", "--model", str(tiny("mtp")), "--device", "cpu", "--batch", "1", "--k", "1",
                 "--no-fixed", "--max-tokens", "2", "--repeats", "2"]) == 0
    assert len(timed) == 4 and timed[0] is timed[2] and timed[1] is timed[3] and timed[0] is not timed[1]
    assert timed[0].speculator is None and timed[1].speculator is not None


def test_decode_modes_compare_the_steps_of_the_batch_bucket():
    """The steps of the batch's power-of-two bucket only (adaptive k compares the modes there): a tail step
    of fewer sequences, or a prefill step, does not lower a mode's rate."""
    from tpserve.tools.bench.spec import Step, decode_modes

    steps = [Step(0.010, True, 16, False, 16), Step(0.002, False, 16, False, 16), Step(0.002, False, 12, False, 12),
             Step(0.004, False, 64, True, 16), Step(0.002, False, 2, False, 2), Step(0.003, False, 9, True, 2)]
    modes = decode_modes(steps, 16)
    assert modes["plain"] == {"steps": 2, "tokens": 28, "tok_s": 7000.0, "ms_per_step": 2.0}
    assert modes["spec"] == {"steps": 1, "tokens": 64, "tok_s": 16000.0, "ms_per_step": 4.0}
    assert decode_modes(steps, 2)["spec"]["tokens"] == 9


def test_bench_spec_passes_every_engine_switch_through(monkeypatch):
    """A switch given to `bench spec` (here --norm-backend torch, --max-num-batched-tokens 96) reaches the
    engines it builds: every field is passed, not a fixed few."""
    import tpserve
    from tpserve.cli import main

    seen = []

    class Stop(Exception):
        pass

    def fake_llm(*a, **kw):
        seen.append(kw)
        raise Stop

    monkeypatch.setattr(tpserve, "LLM", fake_llm)
    try:
        main(["bench", "spec", "--device", "cpu", "--batch", "1", "--k", "1", "--max-tokens", "4", "--repeats", "1",
              "--norm-backend", "torch", "--max-num-batched-tokens", "96"])
    except Stop:
        pass
    assert seen and seen[0]["norm_backend"] == "torch" and seen[0]["max_num_batched_tokens"] == 96


def test_bench_spec_no_fixed_leaves_out_the_fixed_k_rows():
    from tpserve.tools.bench.spec import _settings

    assert [name for name, _ in _settings([1, 3], fixed=False)] == ["off", "adaptive (k<=3)"]
    assert [name for name, _ in _settings([1, 3])] == ["off", "k=1", "k=3", "adaptive (k<=3)"]
