"""The package's layout, kept on disk: the analysis side, the renderers and the run-directory
types import in a process where torch cannot be imported; the import graph has no circles and
no arrow up a layer (``LAYERS``, drawn in docs/architecture.md); a long module says why it is one."""

from __future__ import annotations

import ast
import pathlib
import pkgutil
import subprocess
import sys

import diagnose
import diagnose.analysis
import diagnose.renderers

TORCH_FREE_PACKAGES = ("diagnose.analysis", "diagnose.renderers")
TORCH_FREE_MODULES = (
    "diagnose.units",
    "diagnose.record",
    "diagnose.rundir",
    "diagnose.errors",
    "diagnose.session",
    "diagnose.distributed",
)


def _modules() -> list[str]:
    names = list(TORCH_FREE_MODULES)
    for package in (diagnose.analysis, diagnose.renderers):
        # the prefix makes walk_packages import subpackages by their full name (renderers.html,
        # not the standard library's html)
        names += [m.name for m in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")]
    return names


def test_analysis_side_imports_without_torch() -> None:
    modules = _modules()
    assert any(m.endswith(".timeline") for m in modules) and any(m.endswith(".terminal") for m in modules)
    code = (
        "import sys, importlib\n"
        "sys.modules['torch'] = None  # any 'import torch' now raises ImportError\n"
        f"for name in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError as exc:\n"
        "        if 'tensorboard' in str(exc):\n"
        "            continue  # optional renderer dependency, not torch\n"
        "        raise SystemExit(f'{name}: {exc}')\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "ok"


def test_runtime_side_is_the_only_torch_importer() -> None:
    """No module outside diagnose/runtime/ names torch at import time."""
    import pathlib

    root = pathlib.Path(diagnose.analysis.__file__).parent.parent
    offenders = []
    for path in root.rglob("*.py"):
        if "runtime" in path.relative_to(root).parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith(("import torch", "from torch")):
                offenders.append(f"{path.relative_to(root)}:{number}")
    assert offenders == []


# --- the import graph: layers, no circles ------------------------------------------------------

#: The package's layers, bottom to top (docs/architecture.md, "Layers"). A module imports from its
#: own group and from the layers below; groups side by side in one layer never import each other;
#: and the two sides, the runtime (torch) and the analysis, never import each other at all. A
#: name ending in ``.*`` is a package and everything in it; any other is one module.
LAYERS: tuple[dict[str, tuple[str, ...]], ...] = (
    {
        "ground": (
            "diagnose.version",
            "diagnose.units",
            "diagnose.errors",
            "diagnose.atomic",
            "diagnose.signals",
            "diagnose.progress",
            "diagnose.supervise",
            "diagnose.distributed",
            "diagnose.cliparse",
            "diagnose.stats",
            "diagnose.jupyter",
        )
    },
    # the two contracts: runtime -> analysis (the record), analysis -> renderers (the report's types)
    {"run record": ("diagnose.record",), "report types": ("diagnose.report",)},
    {"run directory": ("diagnose.rundir",)},
    {"runtime": ("diagnose.runtime.*",)},
    {"trace": ("diagnose.analysis.trace.*",)},
    {"measure": ("diagnose.analysis.measure.*",)},
    {"symptoms": ("diagnose.analysis.symptoms.*",), "prediction": ("diagnose.analysis.prediction.*",)},
    {"verdict": ("diagnose.analysis.verdict.*",)},
    {"report": ("diagnose.analysis.report", "diagnose.analysis.bare")},
    {
        "analysis end to end": (
            "diagnose.analysis",
            "diagnose.analysis.pipeline",
            "diagnose.analysis.compare",
            "diagnose.analysis.gate",
        )
    },
    {"renderers": ("diagnose.renderers.*",)},
    {"orchestration": ("diagnose.display", "diagnose.session", "diagnose.experiments", "diagnose.api")},
    {"facade": ("diagnose", "diagnose.cli", "diagnose.__main__")},
)
SIDES = ("diagnose.runtime", "diagnose.analysis")

#: Imports that break the layers today, each owned by an issue-35 branch that removes it: this
#: test fails on any other, and on one of these once it is gone (delete its line then; the list
#: is meant to end empty).
KNOWN_WRONG_IMPORTS: dict[tuple[str, str], str] = {}


def _module_files() -> dict[str, pathlib.Path]:
    root = pathlib.Path(diagnose.__file__).parent
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the diagnose modules it imports: every import statement, at the top, in a
    function or under ``TYPE_CHECKING`` (each is an arrow between layers), and
    ``importlib.import_module("diagnose....")``. ``from package import name`` is an arrow to the
    submodule where ``name`` is one, else to the package."""
    files = _module_files()
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parent + ([base] if base else []))
                for alias in node.names:
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                targets.add(node.args[0].value)
        graph[module] = {t for t in targets if t in files and t != module}
    return graph


def _place(module: str) -> tuple[int, str]:
    """(layer index, group) of a module: the most specific name in LAYERS that covers it."""
    best: tuple[int, int, str] | None = None
    for index, layer in enumerate(LAYERS):
        for group, names in layer.items():
            for name in names:
                covers = module == name or (
                    name.endswith(".*") and (module == name[:-2] or module.startswith(name[:-1]))
                )
                if covers and (best is None or len(name) > best[0]):
                    best = (len(name), index, group)
    assert best is not None, (
        f"{module} is in no layer: add it to LAYERS in tests/test_layout.py (and docs/architecture.md)"
    )
    return best[1], best[2]


def _side(module: str) -> str | None:
    return next((side for side in SIDES if module == side or module.startswith(side + ".")), None)


def wrong_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import against the layers, as ``importer -> imported: why``."""
    wrong = []
    for module, targets in sorted(graph.items()):
        (layer, group), side = _place(module), _side(module)
        for target in sorted(targets):
            (target_layer, target_group), target_side = _place(target), _side(target)
            if side and target_side and side != target_side:
                wrong.append(f"{module} -> {target}: the runtime and the analysis never import each other")
            elif target_layer > layer:
                wrong.append(f"{module} -> {target}: up from {group!r} to {target_group!r}")
            elif target_layer == layer and target_group != group:
                wrong.append(f"{module} -> {target}: {group!r} and {target_group!r} sit side by side")
    return wrong


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def _without_known(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {module: {t for t in targets if (module, t) not in KNOWN_WRONG_IMPORTS} for module, targets in graph.items()}


def test_no_import_goes_up_a_layer() -> None:
    graph = import_graph()
    wrong = [
        line for line in wrong_imports(graph) if tuple(line.split(":")[0].split(" -> ")) not in KNOWN_WRONG_IMPORTS
    ]
    assert wrong == [], "imports against the layers (tests/test_layout.py LAYERS):\n" + "\n".join(wrong)


def test_the_known_wrong_imports_are_still_there() -> None:
    """A known wrong import that is gone comes off the list, so that the list ends empty."""
    graph = import_graph()
    gone = [f"{a} -> {b} ({owner})" for (a, b), owner in KNOWN_WRONG_IMPORTS.items() if b not in graph.get(a, set())]
    assert gone == [], "fixed: delete from KNOWN_WRONG_IMPORTS in tests/test_layout.py:\n" + "\n".join(gone)
    still_wrong = {tuple(line.split(":")[0].split(" -> ")) for line in wrong_imports(graph)}
    assert set(KNOWN_WRONG_IMPORTS) <= still_wrong, "a known wrong import that the layers allow is not wrong"


def test_no_import_circles() -> None:
    cycles = import_cycles(_without_known(import_graph()))
    assert cycles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checks_see_a_circle_and_an_arrow_up() -> None:
    """The checks themselves, on a small made-up graph: a circle is found, an arrow up, one
    across the two sides and one between groups side by side."""
    graph = {
        "diagnose.analysis.trace.timeline": {"diagnose.analysis.measure.breakdown"},
        "diagnose.analysis.measure.breakdown": {"diagnose.analysis.trace.timeline"},
        "diagnose.runtime.capture": {"diagnose.analysis.trace.columns"},
        "diagnose.analysis.symptoms.gpu": {"diagnose.analysis.prediction.replay"},
        "diagnose.units": {"diagnose.record"},
        "diagnose.analysis.trace.columns": set(),
        "diagnose.analysis.prediction.replay": set(),
        "diagnose.record": set(),
    }
    assert import_cycles(graph) == [["diagnose.analysis.measure.breakdown", "diagnose.analysis.trace.timeline"]]
    assert wrong_imports(graph) == [
        "diagnose.analysis.symptoms.gpu -> diagnose.analysis.prediction.replay: 'symptoms' and 'prediction' sit side by side",
        "diagnose.analysis.trace.timeline -> diagnose.analysis.measure.breakdown: up from 'trace' to 'measure'",
        "diagnose.runtime.capture -> diagnose.analysis.trace.columns: the runtime and the analysis never import each other",
        "diagnose.units -> diagnose.record: up from 'ground' to 'run record'",
    ]


def test_every_module_has_a_layer() -> None:
    for module in _module_files():
        _place(module)


# --- long modules -------------------------------------------------------------------------------

#: A module longer than this says at its top why it is one module (a paragraph starting "Why one
#: module" in its docstring): a module should fit on a few screens unless its parts share one
#: private state or one contract.
LONG_MODULE_LINES = 800
#: Long modules that do not say why yet, each owned by an issue-35 branch that shortens it or
#: writes the reason; delete the line then (the test fails on a line that is no longer needed).
KNOWN_LONG_MODULES: dict[str, str] = {}


def _long_without_reason() -> set[str]:
    out = set()
    for module, path in _module_files().items():
        text = path.read_text()
        if text.count("\n") > LONG_MODULE_LINES and "Why one module" not in (ast.get_docstring(ast.parse(text)) or ""):
            out.add(module)
    return out


def test_a_long_module_says_why_it_is_one() -> None:
    unexplained = _long_without_reason()
    assert sorted(unexplained - set(KNOWN_LONG_MODULES)) == [], (
        f"over {LONG_MODULE_LINES} lines: say why at the top, or split"
    )
    assert sorted(set(KNOWN_LONG_MODULES) - unexplained) == [], "short now or explained: delete from KNOWN_LONG_MODULES"
