"""Multi-turn tasks in a workspace of files, through tools: the model lists, reads, finds, writes
and edits files with the tools it is given (names and argument names vary; the description says
what each does), reads each result and ends with an answer. Tasks: how many files of a kind there
are, a value set in a file, which file mentions a word, create a file with given text, replace
text in a file. Tool results have the shapes file tools commonly return (a JSON list of paths,
a file's text, "ok").
"""

from __future__ import annotations

import json
import random

from tpserve.train.chatdoc import EOT, pseudo_word, render_chat
from tpserve.train.stdlib_text import stdlib_identifiers
from tpserve.train.words import ANIMALS, CHORES, CITIES, FOODS, NAMES, NOUNS, OBJECTS, PHRASES

# op: (usual names, descriptions, parameters as (label, argument names, required))
OPS = {
    "list": ("list_files ls list_dir list_directory files show_files",
             "List the files under a folder, recursively | Show every file in a folder and its subfolders | "
             "All file paths below a folder | List every file, recursively", (("path", "path folder dir", False),)),
    "read": ("read_file cat open_file view_file get_file file_text",
             "Read a text file | Return the text of a file | Show the contents of a file | Open a file and return "
             "what it holds", (("path", "path file filename", True),)),
    "find": ("grep find_text grep_files find_in_files files_with which_files",
             "Find the files whose text contains a word | List the files that contain some text | Look for a word "
             "in every file and return the matching paths | Files that contain a pattern",
             (("pattern", "pattern text word needle", True),)),
    "write": ("write_file create_file save_file put_file make_file",
              "Create or overwrite a text file | Write text to a file, replacing what it held | Create a file with "
              "the given content | Save text into a file",
              (("path", "path file filename", True), ("content", "content text data body", True))),
    "edit": ("edit_file replace_in_file patch_file str_replace change_text",
             "Replace text in a file | Change one piece of text in a file into another | Swap old text for new "
             "text inside a file", (("path", "path file", True), ("old", "old old_text before", True),
                                    ("new", "new new_text after replacement", True))),
    "delete": ("delete_file rm unlink_file", "Delete a file | Erase a file for good",
               (("path", "path file", True),)),
    "move": ("move_file rename_file mv", "Move or rename a file | Give a file a new path",
             (("source", "source src old_path", True), ("target", "target dst new_path", True))),
}
FOLDERS = ("", "", "", "notes/", "docs/", "src/", "data/", "logs/", "misc/")
EXTS = (".txt", ".txt", ".md", ".ini", ".json", ".py", ".csv", ".log", ".yaml", ".cfg")
SETTINGS = ("host", "port", "user", "timeout", "mode", "level", "retries", "color", "language", "theme", "owner")
SYSTEMS = ("You work inside a file workspace; all paths are relative to it.",
           "You are an assistant with access to a folder of files. Use the tools to look at them.",
           "Use the file tools to answer. Paths are relative to the workspace root.", "You are a careful assistant.",
           "You are a helpful assistant.")


def _setting(rng: random.Random, key: str):
    if key == "port":
        return rng.randint(1024, 9999)
    if key in ("timeout", "retries", "level"):
        return rng.randint(1, 120)
    if key == "host":
        return rng.choice(["0.0.0.0", "localhost", f"10.0.{rng.randint(0, 9)}.{rng.randint(1, 254)}"])
    return rng.choice(NOUNS + CITIES + NAMES).lower()


def _thing(rng: random.Random) -> str:
    """Something to buy: a food, an object or a made-up word (edits copy it from the request, whatever it is)."""
    r = rng.random()
    return rng.choice(FOODS) if r < 0.5 else rng.choice(OBJECTS) if r < 0.75 else pseudo_word(rng)


def _content(rng: random.Random, ext: str) -> str:
    if ext in (".ini", ".cfg", ".yaml"):
        keys = rng.sample(SETTINGS, rng.randint(1, 4))
        sep = ": " if ext == ".yaml" else " = "
        head = "" if ext == ".yaml" else f"[{rng.choice(['server', 'client', 'app', 'main', 'db'])}]\n"
        return head + "".join(f"{k}{sep}{_setting(rng, k)}\n" for k in keys)
    if ext == ".json":
        return json.dumps({k: _setting(rng, k) for k in rng.sample(SETTINGS, rng.randint(1, 3))}) + "\n"
    if ext == ".py":
        return f"def {rng.choice(NOUNS)}():\n    return {rng.randint(0, 99)}\n"
    if ext == ".csv":
        return ",".join(rng.sample(NOUNS, 3)) + "\n" + ",".join(str(rng.randint(0, 99)) for _ in range(3)) + "\n"
    if ext == ".log":
        return f"INFO {rng.choice(NOUNS)} ready\nWARN {rng.choice(NOUNS)} slow\n"
    r = rng.random()
    if r < 0.35:
        lines = rng.sample(CHORES, rng.randint(1, 3)) + [f"buy {_thing(rng)}" for _ in range(rng.randint(1, 2))]
        lines = list(dict.fromkeys(lines))
        rng.shuffle(lines)
        return "\n".join(lines) + "\n"
    if r < 0.7:
        seen = [rng.choice(ANIMALS).lower()[:-1] for _ in range(rng.randint(1, 3))]
        return f"{rng.choice(NAMES)} saw a " + " and a ".join(seen) + f" near {rng.choice(CITIES)}.\n"
    return rng.choice(PHRASES).capitalize() + ".\n"


def workspace(rng: random.Random) -> dict[str, str]:
    files: dict[str, str] = {}
    while len(files) < rng.randint(3, 8):
        ext = rng.choice(EXTS)
        name = "README.md" if rng.random() < 0.1 else rng.choice(FOLDERS) + rng.choice(NOUNS + FOODS) + ext
        files.setdefault(name, _content(rng, name[name.rfind("."):]))
    return files


def _tool(rng: random.Random, op: str) -> dict:
    names, descs, params = OPS[op]
    r = rng.random()
    name = rng.choice(names.split()) if r < 0.75 else pseudo_word(rng) if r < 0.9 else rng.choice(stdlib_identifiers())
    labels = {label: rng.choice(args.split()) for label, args, _ in params}
    props = {labels[label]: {"type": "string"} for label, _, _ in params}
    required = [labels[label] for label, _, req in params if req or rng.random() < 0.4]
    fn = {"name": name, "description": rng.choice(descs.split(" | ")),
          "parameters": {"type": "object", "properties": props, "required": required}}
    return {"tool": {"type": "function", "function": fn}, "labels": labels, "op": op}


def _settings_of(path: str, text: str) -> list[tuple[str, str]]:
    """(key, value) pairs of a config file as _content writes them."""
    if path.endswith(".json"):
        return [(k, str(v)) for k, v in json.loads(text).items()]
    sep = ": " if path.endswith(".yaml") else " = "
    return [tuple(line.split(sep, 1)) for line in text.splitlines() if sep in line]


def _call(t: dict, **values) -> dict:
    return {"type": "function", "function": {"name": t["tool"]["function"]["name"],
                                             "arguments": {t["labels"][k]: v for k, v in values.items()}}}


def _matches(files: dict, word: str) -> list[str]:
    return sorted(p for p, text in files.items() if word.lower() in text.lower())


def task(rng: random.Random, files: dict, tools: dict) -> tuple[str, list, str, str, dict]:
    """(request, steps as (reasoning, call, result), final reasoning, answer, the files after the
    task's writes). `files` may gain what the task needs before its calls (a config file, a file
    that mentions the word looked for)."""
    kind = rng.choice(["count", "value", "find", "write", "edit"])
    use = rng.choice(["", "", " Use the tools, then answer.", " Use the tools."])
    if kind == "count":
        ext = rng.choice(sorted({p[p.rfind("."):] for p in files}) + [rng.choice(EXTS)])
        hits = [p for p in sorted(files) if p.endswith(ext)]
        ask = rng.choice(["How many {e} files are in the workspace?", "How many {e} files are there (all folders)?",
                          "Count the {e} files in the workspace.", "How many files end in {e}?"]).format(e=ext)
        required = tools["list"]["tool"]["function"]["parameters"]["required"]
        args = {"path": "."} if required or rng.random() < 0.6 else {}
        steps = [("I list the files first.", _call(tools["list"], **args), json.dumps(sorted(files)))]
        why = (f"The files ending in {ext}: {', '.join(hits)}. That is {len(hits)}." if hits
               else f"No file ends in {ext}: 0.")
        answer = rng.choice([str(len(hits)), f"There are {len(hits)} {ext} files.", f"{len(hits)}."])
        if hits and rng.random() < 0.5:  # the files named first: without reasoning, the count follows the list
            answer = f"{', '.join(hits)}: {len(hits)} {ext} file{'s' if len(hits) > 1 else ''}."
        return ask + rng.choice([use, " Answer with the number."]), steps, why, answer, files
    if kind == "value":
        conf = [p for p in files if p.endswith((".ini", ".cfg", ".yaml", ".json"))]
        if not conf:
            files["config.ini"] = _content(rng, ".ini")
            conf = ["config.ini"]
        path = rng.choice(sorted(conf))
        key, value = rng.choice(_settings_of(path, files[path]))
        ask = rng.choice(["What {k} is set in {p}?", "What is the {k} in {p}?", "Look in {p}: what is the {k}?",
                          "Which {k} does {p} set?"]).format(k=key, p=path)
        steps = [(f"The {key} is in {path}; I read it.", _call(tools["read"], path=path), files[path])]
        answer = rng.choice([value, f"The {key} is {value}.", f"{path} sets {key} to {value}."])
        return ask + use, steps, f"{path} sets {key} to {value}.", answer, files
    if kind == "find":
        word = next((w for w in (rng.choice(NOUNS + FOODS) for _ in range(30)) if not _matches(files, w)), "tulip")
        path = rng.choice(sorted(p for p in files if p.endswith((".txt", ".md"))) or ["notes.txt"])
        files[path] = files.get(path, "") + f"A note about the {word}.\n"
        ask = rng.choice(["Which file mentions a {w}?", "Which file mentions {w}? Answer with its path.",
                          "Find the file that talks about {w}.", "Where is {w} mentioned?"]).format(w=word)
        steps = [(f"I look for {word} in the files.", _call(tools["find"], pattern=word), json.dumps([path]))]
        answer = rng.choice([path, f"{path} mentions {word}.", f"It is in {path}."])
        return ask + use, steps, f"Only {path} contains {word}.", answer, files
    if kind == "write":
        path = rng.choice(FOLDERS[:4]) + rng.choice(NOUNS + FOODS + ("hello", "out", "result")) + rng.choice(EXTS[:3])
        text = rng.choice(PHRASES) if rng.random() < 0.6 else f"{rng.choice(NOUNS)} {rng.choice(NOUNS + CITIES)}"
        ask = rng.choice(["Create the file {p} containing: {t}", "Write '{t}' to {p}.",
                          "Make a file named {p} with the text: {t}", "Create {p} with the content '{t}'.",
                          "Save the text '{t}' as {p}."]).format(p=path, t=text)
        steps = [(f"I write the text to {path}.", _call(tools["write"], path=path, content=text), "ok")]
        done = rng.choice([f"Done: {path} holds the text.", f"Created {path}."])
        return ask, steps, f"{path} is written.", done, {**files, path: text}
    texts = sorted(p for p in files if p.endswith((".txt", ".md", ".log")))
    if not texts:
        files["todo.txt"] = _content(rng, ".txt")
        texts = ["todo.txt"]
    path = rng.choice(texts)
    old = rng.choice([line for line in files[path].splitlines() if line.strip()])
    words = old.split()
    words[-1] = rng.choice(NOUNS + FOODS) if rng.random() < 0.6 else _thing(rng)
    new = " ".join(words)
    ask = rng.choice(["In {p}, replace '{o}' with '{n}'.", "In {p}, replace '{o}' with '{n}'. Change nothing else.",
                      "Change '{o}' to '{n}' in {p}.", "Edit {p}: '{o}' becomes '{n}'."]).format(p=path, o=old, n=new)
    steps = [(f"I read {path} first.", _call(tools["read"], path=path), files[path])] if rng.random() < 0.4 else []
    steps.append((f"I replace the text in {path}.", _call(tools["edit"], path=path, old=old, new=new), "ok"))
    done = rng.choice(["Done.", f"Done: {path} now says '{new}'.", "Replaced."])
    return ask, steps, f"{path} is changed.", done, {**files, path: files[path].replace(old, new, 1)}


def file_agent_chat(rng: random.Random) -> str:
    """A workspace, 5-6 file tools, one or two tasks done step by step, thinking or not."""
    files = workspace(rng)
    tools: dict = {}
    extra = [rng.choice(["delete", "move"])] if rng.random() < 0.3 else []
    for op in ["list", "read", "find", "write", "edit"] + extra:
        t = _tool(rng, op)
        while any(t["tool"]["function"]["name"] == u["tool"]["function"]["name"] for u in tools.values()):
            t = _tool(rng, op)
        tools[op] = t
    declared = [t["tool"] for t in tools.values()]
    rng.shuffle(declared)
    thinking = rng.random() < 0.5
    keep_steps = rng.random() < 0.5  # clients often drop the reasoning of earlier turns
    messages = [{"role": "system", "content": rng.choice(SYSTEMS)}] if rng.random() < 0.5 else []
    for _ in range(rng.choice([1, 1, 1, 2])):
        ask, steps, why, answer, files = task(rng, files, tools)
        messages.append({"role": "user", "content": ask})
        for reason, call, result in steps:
            msg = {"role": "assistant", "content": "", "tool_calls": [call]}
            if thinking and keep_steps:
                msg["reasoning_content"] = reason
            messages += [msg, {"role": "tool", "content": result}]
        final = {"role": "assistant", "content": answer}
        if thinking:
            final["reasoning_content"] = why
        messages.append(final)
    return render_chat(messages, declared, thinking=thinking) + EOT
