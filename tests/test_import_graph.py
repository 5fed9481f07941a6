"""tpserve's modules import one another without circles, deferred (function-level) imports included: where two
modules need each other's code, it belongs in a module below both (as model/errors.py, model/quant_config.py,
tools/bench/collectives_common.py, kernels/moe/tiles_triton.py and paths.py are). Imports of the package itself (`from tpserve
import LLM`, its public face) are left out."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """module -> the tpserve modules it imports anywhere in its file."""
    files = {".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (src / "tpserve").rglob("*.py")}
    graph = {}
    for mod, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:  # `from pkg import module` names a module; else the module itself
                    name = f"{node.module}.{alias.name}"
                    deps.add(name if name in files else node.module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[mod] = {d for d in deps if d in files and d not in (mod, "tpserve")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


LAYERS = ("base", "kernels", "collectives", "model", "engine", "server", "train", "tools")
BASE = {"config", "paths", "sampling_params", "builtin"}  # builtin: the shipped demo checkpoint (data)
SIDE = {"llm": "server", "cli": "tools"}  # top-level modules that belong to a package's layer


def layer(module: str) -> str:
    """The layer of a tpserve module (`tpserve.engine.spec.policy` -> engine)."""
    part = module.split(".")[1]
    if part in BASE:
        return "base"
    part = SIDE.get(part, part)
    if part not in LAYERS:
        raise KeyError(f"{module}: not in any layer (add its package to LAYERS)")
    return part


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs from a lower layer up to a higher one, as 'a (layer) -> b (layer)'."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(f"{m} ({layer(m)}) -> {d} ({layer(d)})" for m, deps in graph.items() if m != "tpserve"
                  for d in deps if rank[layer(d)] > rank[layer(m)])


def test_upward_finds_a_planted_one():
    graph = {"tpserve.model.mla": {"tpserve.kernels.attention.mla_triton", "tpserve.engine.cache"},
             "tpserve.kernels.attention.mla_triton": {"tpserve.config"}, "tpserve.engine.cache": set(), "tpserve.config": set()}
    assert upward(graph) == ["tpserve.model.mla (model) -> tpserve.engine.cache (engine)"]


def test_no_package_imports_a_higher_layer():
    graph = import_graph()
    assert {layer(m) for m in graph if m != "tpserve"} == set(LAYERS)
    assert upward(graph) == []


def test_circles_finds_a_planted_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_tpserve():
    graph = import_graph()
    assert "tpserve.engine.engine" in graph and "tpserve.model.quant_config" in graph["tpserve.model.quant"]
    assert circles(graph) == []
