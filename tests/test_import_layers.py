"""Each package's modules import each other in layers, never in a cycle, and never back up a stage.

Every import statement counts wherever it stands: at module level, inside a
function, or under ``if TYPE_CHECKING:``. A function-local import only
delays a cycle, and a type-only one still ties a lower module to an upper
one, so neither is a way around the layering.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import prime_runs
import prime_traces

Graph = dict[str, set[str]]


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: source file}`` of every module under ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> Iterator[tuple[str, ...]]:
    """What each name of ``node`` imports: ``from a import b`` is ``a.b`` if a module, else ``a``."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield (alias.name,)
        return
    base = node.module or ""
    if node.level:
        anchor = name.split(".") if is_package else name.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base]) if base else ".".join(anchor)
    for alias in node.names:
        yield (f"{base}.{alias.name}", base)


def import_graph(modules: dict[str, Path]) -> Graph:
    """Which of ``modules`` each of them imports."""
    graph: Graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = graph.setdefault(name, set())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for choices in _imported(node, name, path.name == "__init__.py"):
                target = next((choice for choice in choices if choice in modules), None)
                if target is not None and target != name:
                    edges.add(target)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The shortest cycle, ``[a, b, ..., a]``, through each module that is on one."""
    found: list[list[str]] = []
    for group in _tangles(graph):
        for start in sorted(group):
            cycle = _shortest_cycle(graph, group, start)
            at = cycle.index(min(cycle))
            cycle = [*cycle[at:-1], *cycle[:at], cycle[at]]
            if cycle not in found:
                found.append(cycle)
    return found


def _tangles(graph: Graph) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # the package is small enough to recurse
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def _shortest_cycle(graph: Graph, group: set[str], start: str) -> list[str]:
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & group):
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if succ not in came_from:
                    came_from[succ] = node
                    following.append(succ)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def test_the_package_has_no_import_cycle():
    root = Path(prime_traces.__file__).parent
    modules = modules_of(root, "prime_traces")
    assert "prime_traces.server._service" in modules
    found = cycles(import_graph(modules))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_prime_runs_has_no_import_cycle():
    root = Path(prime_runs.__file__).parent
    modules = modules_of(root, "prime_runs")
    assert "prime_runs.run" in modules
    found = cycles(import_graph(modules))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize(
    "back_import",
    [
        pytest.param("from pkg.sub._high import VALUE\n", id="module-level"),
        pytest.param("def f():\n    from pkg.sub import _high\n", id="function-local"),
        pytest.param("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import _high\n", id="type-only"),
        pytest.param("from ..sub._high import VALUE\n", id="relative"),
    ],
)
def test_a_cycle_is_found_and_named(tmp_path, back_import):
    _write(
        tmp_path / "pkg",
        {
            "__init__.py": "from pkg.sub import _high\n",
            "sub/__init__.py": "",
            "sub/_low.py": "VALUE = 1\nimport pkg.sub._mid\n",
            "sub/_mid.py": back_import,
            "sub/_high.py": "import os\nfrom pkg.sub._low import VALUE\n",
        },
    )
    graph = import_graph(modules_of(tmp_path / "pkg", "pkg"))
    assert cycles(graph) == [["pkg.sub._high", "pkg.sub._low", "pkg.sub._mid", "pkg.sub._high"]]


def test_layers_without_a_cycle_pass(tmp_path):
    _write(
        tmp_path / "pkg",
        {
            "__init__.py": "from pkg._high import run\n",
            "_low.py": "VALUE = 1\n",
            "_high.py": "from pkg import _low\nfrom pkg._low import VALUE\ndef run():\n    from pkg import _low\n",
        },
    )
    graph = import_graph(modules_of(tmp_path / "pkg", "pkg"))
    assert graph["pkg"] == {"pkg._high"}
    assert cycles(graph) == []


# Each package's stages, top first, in the order data flows through them: a module
# imports modules of its own stage or of a stage below, never one above.
PRIME_RUNS_STAGES: list[tuple[str, ...]] = [
    ("prime_runs.cli",),  # the prime-runs command line, the demo and its workload
    ("prime_runs", "prime_runs.metrics", "prime_runs.projection"),  # the public face
    ("prime_runs._start",),  # init(): the mode, the run created or attached, its pipeline
    ("prime_runs.run",),  # Run
    ("prime_runs._finish",),  # finish(), the exit hook, signals
    ("prime_runs._history",),  # run.log(): the metrics history and its own lane
    ("prime_runs._upload",),  # the queue and the upload worker
    ("prime_runs._sinks",),  # the Traces service (with outages), a run directory
    ("prime_runs._local",),  # the run directory: segments, run.json, the spool, sync
    ("prime_runs._service",),  # the run on the service: its owner, state and updates
    ("prime_runs._console",),  # the lines on stderr
    ("prime_runs._records",),  # the sink contract, the ledger, accounting, reasons, lines, sample rows
    ("prime_runs.errors", "prime_runs.models", "prime_runs.exceptions"),  # the public values and errors
]
PRIME_TRACES_STAGES: list[tuple[str, ...]] = [
    ("prime_traces.cli", "prime_traces.cli_output"),  # the prime-traces command line
    ("prime_traces",),  # the public face
    ("prime_traces.client", "prime_traces.platform"),  # TracesClient, PlatformClient
    ("prime_traces._upload", "prime_traces.report"),  # batches, their requests, the window
    ("prime_traces._api",),  # reads, runs, response models
    ("prime_traces._http", "prime_traces.config", "prime_traces.platform_config"),  # transport, retries, settings
    ("prime_traces.server",),  # the local service: shares only the line rules
    ("prime_traces._lines", "prime_traces.encoding"),  # encoder, chunker, sizing, line rules
    ("prime_traces.errors", "prime_traces.threads", "prime_traces.version"),
]


def stage_of(module: str, stages: list[tuple[str, ...]]) -> int | None:
    """The index of the stage whose longest prefix names ``module``; None when none does.

    A package's own name stands for its ``__init__`` alone, so that a new module
    at its top is on no stage until it is given one.
    """
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(stages):
        for prefix in prefixes:
            inside = "." in prefix and module.startswith(prefix + ".")
            if (module == prefix or inside) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return best[0] if best is not None else None


def imports_up(graph: Graph, stages: list[tuple[str, ...]]) -> list[str]:
    """Every import of a module from a stage above its own, and every module on no stage."""
    found = [f"{module} is on no stage" for module in sorted(graph) if stage_of(module, stages) is None]
    for module in sorted(graph):
        for target in sorted(graph[module]):
            here, there = stage_of(module, stages), stage_of(target, stages)
            if here is not None and there is not None and there < here:
                found.append(f"{module} -> {target}")
    return found


@pytest.mark.parametrize(
    ("package", "stages"),
    [(prime_runs, PRIME_RUNS_STAGES), (prime_traces, PRIME_TRACES_STAGES)],
    ids=["prime_runs", "prime_traces"],
)
def test_no_import_runs_back_up_a_stage(package, stages):
    modules = modules_of(Path(package.__file__).parent, package.__name__)
    assert imports_up(import_graph(modules), stages) == []
    assert {stage_of(module, stages) for module in modules} == set(range(len(stages)))  # every stage is used


def test_an_import_up_a_stage_and_a_module_on_none_are_named(tmp_path):
    _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "_top/__init__.py": "",
            "_top/a.py": "from pkg._low import b\n",
            "_low/__init__.py": "",
            "_low/b.py": "def f():\n    from pkg._top import a\n",
            "stray.py": "",
        },
    )
    graph = import_graph(modules_of(tmp_path / "pkg", "pkg"))
    stages = [("pkg",), ("pkg._top",), ("pkg._low",)]
    assert imports_up(graph, stages) == ["pkg.stray is on no stage", "pkg._low.b -> pkg._top.a"]
