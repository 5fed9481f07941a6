"""LLM.chat (vLLM's offline chat) and `tpserve make-tiny` refusing to overwrite."""

import pytest

from tpserve.llm import LLM
from tpserve.sampling_params import SamplingParams
from tpserve.server.chat import apply_chat_template

MSGS = [{"role": "user", "content": "hello"}]
TOOLS = [{"type": "function", "function": {"name": "lookup_thing", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def llm(tiny):
    with LLM(str(tiny("default")), device="cpu", kv_cache_memory="8MiB") as llm:
        yield llm


def test_chat_renders_the_template_and_generates(llm):
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    tok = llm.get_tokenizer()
    (out,) = llm.chat(MSGS, greedy, chat_template_kwargs={"enable_thinking": False})
    text = apply_chat_template(tok, MSGS, None, enable_thinking=False)
    assert out.prompt == text and out.prompt_token_ids == tok.encode(text, add_special_tokens=False)
    (ref,) = llm.generate([{"prompt_token_ids": out.prompt_token_ids}], greedy)
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids and len(ref.outputs[0].token_ids) == 4
    both = llm.chat([MSGS, MSGS + [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"}]],
                    SamplingParams(max_tokens=1), tools=TOOLS)
    assert len(both) == 2 and all("lookup_thing" in o.prompt for o in both)
    assert both[0].prompt != both[1].prompt


def test_chat_rejects_bad_messages(llm):
    with pytest.raises(ValueError, match="messages"):
        llm.chat([])
    with pytest.raises(ValueError, match=r"messages\[0\].role"):
        llm.chat([{"role": "wizard", "content": "x"}])


def test_make_tiny_refuses_to_overwrite(tmp_path, capsys):
    from tpserve.cli import build_parser

    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    args = build_parser().parse_args(["make-tiny", str(out), "--layers", "1"])
    with pytest.raises(SystemExit, match="--force"):
        args.func(args)
    assert not (out / "config.json").exists()
    args = build_parser().parse_args(["make-tiny", str(out), "--layers", "1", "--force"])
    assert args.func(args) == 0 and (out / "config.json").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    args = build_parser().parse_args(["make-tiny", str(empty), "--layers", "1"])
    assert args.func(args) == 0  # an empty directory is fine
