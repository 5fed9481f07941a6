"""Text and names from the Python standard library's own source files (shipped with every Python):
docstrings and code for plain-text documents, identifiers and docstring words for tool names."""

from __future__ import annotations

import ast
import re
import sysconfig
from functools import lru_cache
from pathlib import Path

from tpserve.train.chatdoc import held_out_vocabulary, is_held_out


def _stdlib_modules():
    """(source, AST) of each of the standard library's top-level modules, in sorted order (those
    that do not parse here are skipped)."""
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue
        yield src, tree


@lru_cache(maxsize=1)
def stdlib_identifiers() -> tuple[str, ...]:
    """snake_case names from the standard library's top-level modules (functions, classes,
    variables, arguments), none with a held-out word as a part: real words and subwords in
    unfamiliar combinations, for tool and argument names."""
    held = held_out_vocabulary()
    names = set()
    for _, tree in _stdlib_modules():
        for node in ast.walk(tree):
            name = getattr(node, "name", None) if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
                node.id if isinstance(node, ast.Name) else node.arg if isinstance(node, ast.arg) else None
            if (name and re.fullmatch(r"[a-z]+(_[a-z]+)+", name) and 6 <= len(name) <= 24
                    and not set(name.split("_")) & held):
                names.add(name)
    return tuple(sorted(names))


@lru_cache(maxsize=1)
def stdlib_texts() -> tuple[str, ...]:
    """Docstrings and source of the standard library's top-level modules, in sorted order."""
    out = []
    for src, tree in _stdlib_modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 80:
                    out.append(doc)
        for start in range(0, min(len(src), 60000), 3000):
            out.append(src[start:start + 3000])
    return tuple(out)


@lru_cache(maxsize=1)
def stdlib_words() -> tuple[str, ...]:
    """Lowercase words (3-12 letters) that occur at least three times in the standard library's
    docstrings, in sorted order."""
    counts: dict[str, int] = {}
    for text in stdlib_texts():
        if "def " in text or "import " in text:  # source chunks: identifiers, not prose
            continue
        for w in re.findall(r"\b[a-z]{3,12}\b", text):
            counts[w] = counts.get(w, 0) + 1
    return tuple(sorted(w for w, c in counts.items() if c >= 3))


@lru_cache(maxsize=1)
def held_in_doc_words() -> tuple[str, ...]:
    """stdlib_words() less the held-out ones (is_held_out): names for training tools."""
    return tuple(w for w in stdlib_words() if not is_held_out(w))
