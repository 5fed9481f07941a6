"""`tpserve agent-tools --url U`: five multi-turn file-tool tasks through the chat API with tools.

Each task gets a fresh temporary workspace and the tools list_files, read_file, search,
write_file, edit_file (they act inside that workspace only). The driver sends the task, runs
every tool call the model makes, returns the results as `tool` messages, and stops at a final
answer or after --max-turns. Each task is then judged on the workspace and the answer, PASS or
FAIL with the reason, once non-streamed and once streamed; every transcript is saved as JSON.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from tpserve.tools.client import Client, ToolError, collect_chat_stream, emit_json, friendly

SEED_FILES = {
    "README.md": "Workspace for the agent-tools check.\n",
    "config.ini": "[server]\nhost = 0.0.0.0\nport = 8123\n",
    "notes/birds.txt": "Seen today: a heron, two gulls and a pelican.\n",
    "notes/trees.txt": "Oak, ash and birch.\n",
    "todo.txt": "buy milk\nwater the plants\ncall Sam\n",
    "data.txt": "1,2,3\n",
}

TOOLS = [
    {"type": "function", "function": {"name": "list_files", "description": "List all files (recursive) under a folder",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "read_file", "description": "Read a text file",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
    {"type": "function", "function": {"name": "search", "description": "Files whose text contains a word",
                                      "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}},
                                                     "required": ["pattern"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "Create or overwrite a text file",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"}, "content": {"type": "string"}},
                                          "required": ["path", "content"]}}},
    {"type": "function", "function": {"name": "edit_file", "description": "Replace text in a file",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"}, "old": {"type": "string"},
                                          "new": {"type": "string"}}, "required": ["path", "old", "new"]}}},
]


def _judge_list(ws: Path, answer: str, calls: list) -> str | None:
    if "list_files" not in calls:
        return "never called list_files"
    return None if "4" in answer else f"answer lacks the count 4: {answer[:80]!r}"


def _judge_read(ws: Path, answer: str, calls: list) -> str | None:
    if "read_file" not in calls:
        return "never called read_file"
    return None if "8123" in answer else f"answer lacks 8123: {answer[:80]!r}"


def _judge_search(ws: Path, answer: str, calls: list) -> str | None:
    if "search" not in calls:
        return "never called search"
    return None if "birds.txt" in answer else f"answer lacks birds.txt: {answer[:80]!r}"


def _judge_write(ws: Path, answer: str, calls: list) -> str | None:
    f = ws / "hello.txt"
    if not f.is_file():
        return "hello.txt was not written"
    return None if f.read_text().strip() == "hello world" else f"hello.txt holds {f.read_text()[:40]!r}"


def _judge_edit(ws: Path, answer: str, calls: list) -> str | None:
    text = (ws / "todo.txt").read_text()
    if text != "buy bread\nwater the plants\ncall Sam\n":
        return f"todo.txt is {text[:60]!r}"
    return None


TASKS = {
    "list": ("How many .txt files are in the workspace (all folders)? Use the tools, then answer with the number.",
             _judge_list),
    "read": ("What port is set in config.ini? Use the tools, then answer with the port.", _judge_read),
    "search": ("Which file mentions a pelican? Use the search tool, then answer with the file's path.",
               _judge_search),
    "write": ("Create the file hello.txt containing exactly: hello world", _judge_write),
    "edit": ("In todo.txt, replace 'buy milk' with 'buy bread'. Change nothing else.", _judge_edit),
}


class Workspace:
    """The tools, confined to one folder."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        for name, text in SEED_FILES.items():
            (self.root / name).parent.mkdir(parents=True, exist_ok=True)
            (self.root / name).write_text(text)

    def _path(self, p) -> Path:
        if not isinstance(p, str):
            raise ValueError("path must be a string")
        full = (self.root / p).resolve()
        if full != self.root and self.root not in full.parents:
            raise ValueError(f"{p!r} is outside the workspace")
        return full

    def call(self, name: str, args: dict) -> str:
        if name == "list_files":
            base = self._path(args.get("path") or ".")
            return json.dumps(sorted(str(f.relative_to(self.root)) for f in base.rglob("*") if f.is_file()))
        if name == "read_file":
            return self._path(args["path"]).read_text()
        if name == "search":
            pat = str(args["pattern"])
            return json.dumps(sorted(str(f.relative_to(self.root)) for f in self.root.rglob("*")
                                     if f.is_file() and pat.lower() in f.read_text().lower()))
        if name == "write_file":
            f = self._path(args["path"])
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(str(args["content"]))
            return "ok"
        if name == "edit_file":
            f = self._path(args["path"])
            text = f.read_text()
            if args["old"] not in text:
                return f"error: {args['old']!r} not found in {args['path']}"
            f.write_text(text.replace(args["old"], args["new"], 1))
            return "ok"
        return f"error: unknown tool {name!r}"


def _turn(c: Client, messages: list, stream: bool, max_tokens: int) -> dict:
    body = {"model": c.model, "messages": messages, "tools": TOOLS, "tool_choice": "auto", "temperature": 0,
            "max_tokens": max_tokens}
    if stream:
        m = collect_chat_stream(c.stream("/v1/chat/completions", body))
        return {"content": m["content"], "tool_calls": m["tool_calls"], "finish_reason": m["finish_reason"]}
    r = c.post("/v1/chat/completions", body)
    ch = r["choices"][0]
    msg = ch["message"]
    return {"content": msg.get("content") or "", "tool_calls": msg.get("tool_calls") or [],
            "finish_reason": ch.get("finish_reason")}


def run_task(c: Client, name: str, stream: bool, max_turns: int, max_tokens: int) -> dict:
    prompt, judge = TASKS[name]
    with tempfile.TemporaryDirectory(prefix=f"tpserve-agent-{name}-") as tmp:
        ws = Workspace(Path(tmp))
        messages = [{"role": "system", "content": "You are a careful assistant working in a file workspace. "
                                                  "Use the tools; paths are relative to the workspace."},
                    {"role": "user", "content": prompt}]
        called, answer, problem = [], "", None
        for _ in range(max_turns):
            reply = _turn(c, messages, stream, max_tokens)
            calls = reply["tool_calls"]
            if not calls:
                answer = reply["content"]
                messages.append({"role": "assistant", "content": answer})
                break
            if reply["finish_reason"] != "tool_calls":
                problem = f"tool calls with finish_reason {reply['finish_reason']!r}"
            messages.append({"role": "assistant", "content": reply["content"] or None, "tool_calls": calls})
            for call in calls:
                fn = call.get("function") or {}
                called.append(fn.get("name"))
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                    if not isinstance(args, dict):
                        raise ValueError("arguments must be a JSON object")
                    result = ws.call(fn.get("name"), args)
                except (ValueError, KeyError, OSError) as exc:
                    result = f"error: {type(exc).__name__}: {exc}"
                messages.append({"role": "tool", "tool_call_id": call.get("id") or "", "content": result})
        else:
            problem = problem or f"no final answer after {max_turns} turns"
        problem = problem or judge(ws.root, answer, called)
    return {"task": name, "stream": stream, "ok": problem is None, "reason": problem or "done",
            "tool_calls": called, "answer": answer, "transcript": messages}


def register(sub, bench, tune) -> None:
    from tpserve.tools.client import add_client_args

    p = sub.add_parser("agent-tools", help="multi-turn file-tool tasks through the chat API")
    add_client_args(p)
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma list of {', '.join(TASKS)}")
    p.add_argument("--mode", choices=("both", "stream", "nostream"), default="both")
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=512, help="per model turn")
    p.add_argument("--transcripts", default=None, help="folder for the transcripts (default: a new temp folder)")
    p.set_defaults(func=run)


@friendly
def run(args) -> int:
    from tqdm import tqdm

    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in names if t not in TASKS]
    if unknown or not names:
        raise ToolError(f"--tasks: unknown {unknown}; choose from {', '.join(TASKS)}")
    modes = {"both": [False, True], "stream": [True], "nostream": [False]}[args.mode]
    out_dir = Path(args.transcripts or tempfile.mkdtemp(prefix="tpserve-agent-transcripts-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    c = Client(args.url, args.api_key, args.served_model)
    rows = []
    try:
        _ = c.model
        for name, stream in tqdm([(n, s) for n in names for s in modes], desc="agent-tools", unit="task",
                                 leave=False):
            try:
                row = run_task(c, name, stream, args.max_turns, args.max_tokens)
            except ToolError as exc:
                if "connect" in str(exc) or "API key" in str(exc):
                    raise
                row = {"task": name, "stream": stream, "ok": False, "reason": str(exc), "tool_calls": [],
                       "answer": "", "transcript": []}
            path = out_dir / f"{name}-{'stream' if stream else 'nostream'}.json"
            path.write_text(json.dumps(row, indent=2))
            row["transcript_file"] = str(path)
            rows.append(row)
    finally:
        c.close()
    if args.json_out != "-":
        for r in rows:
            print(f"{'PASS' if r['ok'] else 'FAIL'}  {r['task']:<6} {'stream' if r['stream'] else 'plain':<6}  "
                  f"{r['reason'][:100]}  (tools: {', '.join(map(str, r['tool_calls'])) or 'none'})")
        print(f"{sum(r['ok'] for r in rows)}/{len(rows)} passed; transcripts in {out_dir}")
    emit_json(args.json_out, {"url": c.url, "model": c.model, "transcripts": str(out_dir),
                              "results": [{k: v for k, v in r.items() if k != "transcript"} for r in rows]})
    return 0 if all(r["ok"] for r in rows) else 1
