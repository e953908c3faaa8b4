"""Layers, one direction: stages/ sits on top; nothing below it imports it, no
tfmlops modules import each other in a cycle, and neither do its packages.

The import graph is read from the source with `ast` (nothing is imported), and
counts every import statement: module level, inside functions, under
TYPE_CHECKING. A package's `__init__.py` is its own node (`tfmlops.training`).
cli.py reaches the stages by `importlib` on purpose: that is the one entry.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tfmlops

SRC = Path(tfmlops.__file__).parent


def module_names(root: Path) -> dict[str, Path]:
    """{dotted name: file} of every module of the package at `root`."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """`name` itself if it is a module, else its longest known prefix (`pkg.mod.func`)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def _imported(node: ast.AST, module: str, is_package: bool, root_name: str) -> list[str]:
    """Dotted names an import statement loads (`from a import b`: `a.b`, then `a`)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: from the module's package, `level` steps up
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1])
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    if source.split(".")[0] != root_name:
        return []
    return [f"{source}.{alias.name}" for alias in node.names]


def import_graph(root: Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, for the package at `root`."""
    known = module_names(root)
    graph = {}
    for module, path in known.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for name in _imported(node, module, path.name == "__init__.py", root.name):
                target = _resolve(name, known)
                if target is not None and target != module:
                    targets.add(target)
        graph[module] = targets
    return graph


def upward_imports(graph: dict[str, set[str]], root_name: str = "tfmlops") -> list[str]:
    """`a -> b` for each module outside stages/ that imports stages/ (the CLI too: it
    reaches a stage by its name, stage_spec.package)."""
    stages = f"{root_name}.stages"

    def inside(m: str) -> bool:
        return m == stages or m.startswith(stages + ".")

    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if inside(b) and not inside(a))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected component of more than one module."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_of(module: str) -> str:
    """The node a module belongs to in the package graph: its sub-package
    (`tfmlops.config` for `tfmlops.config.sections.data`) or, at the top, itself."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """{package: {package it imports: the module imports that make the edge}}."""
    packages: dict[str, dict[str, list[str]]] = {}
    for a, targets in sorted(graph.items()):
        edges = packages.setdefault(package_of(a), {})
        for b in sorted(targets):
            if package_of(b) != package_of(a):
                edges.setdefault(package_of(b), []).append(f"{a} -> {b}")
    return packages


def package_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each cycle among packages, with the module imports inside it that close it."""
    packages = package_graph(graph)
    found = []
    for component in cycles({p: set(edges) for p, edges in packages.items()}):
        inside = [line for p in component for q, lines in packages[p].items()
                  if q in component for line in lines]
        found.append(f"{' <-> '.join(component)}: {'; '.join(inside)}")
    return found


def test_nothing_below_the_stages_imports_them():
    assert upward_imports(import_graph(SRC)) == []


def test_no_import_cycles_among_tfmlops_modules():
    assert cycles(import_graph(SRC)) == []


def test_no_import_cycles_among_tfmlops_packages():
    found = package_cycles(import_graph(SRC))
    assert found == [], "packages import each other:\n" + "\n".join(found)


def test_the_graph_sees_function_level_and_relative_imports():
    graph = import_graph(SRC)
    assert len(graph) > 40
    # imported inside `run`, so `tfmlops --help` stays light
    assert "tfmlops.stages.tune.tuner" in graph["tfmlops.stages.tune"]
    assert "tfmlops.stages.train.fit" in graph["tfmlops.stages.train"]


def fake_package(tmp_path: Path, modules: dict[str, str]) -> Path:
    """A `tfmlops` package under `tmp_path`: {path in it: source}, each folder a package."""
    pkg = tmp_path / "tfmlops"
    for rel, source in modules.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(source)
    for folder in [pkg, *(p for p in pkg.rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return pkg


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    """A package built to break both rules: the checks name each violation."""
    graph = import_graph(fake_package(tmp_path, {
        "stages/train.py": "from tfmlops.core import fit\n",
        "core/fit.py": "def f():\n    from tfmlops.stages.train import run\n",  # upward, inside a function
        "core/a.py": "from . import b\n",  # relative, a <-> b
        "core/b.py": "import tfmlops.core.a\n",
        "cli.py": "from tfmlops.stages import train\n",  # the CLI too: by name only
    }))
    assert upward_imports(graph) == ["tfmlops.cli -> tfmlops.stages.train",
                                     "tfmlops.core.fit -> tfmlops.stages.train"]
    assert sorted(map(tuple, cycles(graph))) == [
        ("tfmlops.core.a", "tfmlops.core.b"),
        ("tfmlops.core.fit", "tfmlops.stages.train"),
    ]


def test_package_cycles_names_packages_and_the_imports_that_close_them(tmp_path):
    graph = import_graph(fake_package(tmp_path, {
        "low/a.py": "def f():\n    from tfmlops.high import b\n",
        "high/b.py": "from tfmlops.low import c\n",  # no cycle of modules
        "low/c.py": "",
        "top.py": "from tfmlops.low import a\n",  # one way: no cycle
    }))
    assert cycles(graph) == []
    assert package_cycles(graph) == [
        "tfmlops.high <-> tfmlops.low: tfmlops.high.b -> tfmlops.low.c; "
        "tfmlops.low.a -> tfmlops.high.b"]


def long_functions(root: Path, limit: int) -> list[str]:
    """`module:function (lines)` of every function longer than `limit` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(root)}:{node.name} ({lines})")
    return found


def test_functions_stay_small():
    assert long_functions(SRC, 80) == []


def test_long_functions_names_a_long_one(tmp_path):
    (tmp_path / "m.py").write_text("def f():\n" + "    x = 1\n" * 81)
    assert long_functions(tmp_path, 80) == ["m.py:f (82)"]


def test_each_stage_packages_run_is_at_most_150_lines():
    """(c) `stages/<name>/__init__.py` holds the SPEC and `run`: the stage read top down;
    the work is in the modules beside it, the lifecycle in the harness."""
    big = {p.parent.name: n for p in (SRC / "stages").glob("*/__init__.py")
           if (n := len(p.read_text().splitlines())) > 150}
    assert big == {}


def stage_package(module: str, root_name: str = "tfmlops") -> str | None:
    """`prepare` for tfmlops.stages.prepare and every module in it; None outside stages/."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == [root_name, "stages"] else None


def cross_stage_imports(graph: dict[str, set[str]]) -> list[str]:
    """(a) `a -> b` for each stage package importing another (doctor runs three stages)."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if stage_package(a) not in (None, "doctor") and stage_package(b)
                  and stage_package(b) != stage_package(a))


# Modules no stage imports that are still shared: each package's docstring, and what a
# registered model loads by path (MLflow imports serving/pyfunc_model.py; `tfmlops serve`,
# with its lean path).
ENTRY_MODULES = {"tfmlops", "tfmlops.cli", "tfmlops.__main__", "tfmlops.serving.server",
                 "tfmlops.serving.lean", "tfmlops.serving.pyfunc_model"}


def single_stage_modules(graph: dict[str, set[str]], pipeline=None,
                         root: Path = SRC) -> list[str]:
    """(b) Each module outside stages/ that only one stage package reaches (or none, nor
    `serve` nor `sync`): it belongs in that stage's folder."""
    from tfmlops.stage_spec import PIPELINE

    def closure(starts) -> set[str]:
        seen, todo = set(starts), list(starts)
        while todo:
            for n in graph.get(todo.pop(), ()):
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen

    users = {s: closure([m for m in graph if stage_package(m) == s]) for s in pipeline or PIPELINE}
    users["serve"] = closure(["tfmlops.serving.server"])
    users["sync"] = closure(["tfmlops.tracking"])
    found = []
    for m in sorted(graph):
        if stage_package(m) or m in ENTRY_MODULES or (root.parent / m.replace(".", "/")).is_dir():
            continue
        reached = [u for u, seen in users.items() if m in seen]
        if len(reached) < 2:
            found.append(f"{m}: {reached or 'nothing'}")
    return found


def test_no_stage_package_imports_another():
    assert cross_stage_imports(import_graph(SRC)) == []


def test_a_module_only_one_stage_uses_lives_in_its_folder():
    assert single_stage_modules(import_graph(SRC)) == []


def test_the_stage_rules_catch_a_cross_import_and_a_single_stage_module(tmp_path):
    root = fake_package(tmp_path, {
        "stages/prune/__init__.py": "from tfmlops.stages.quantize import tflite\n"
                                    "from tfmlops.core import shared\n",
        "stages/quantize/__init__.py": "from tfmlops.core import convert, shared\n",
        "stages/quantize/tflite.py": "",
        "core/convert.py": "",
        "core/shared.py": "",
        "serving/server.py": "",
        "tracking/__init__.py": "",
    })
    graph = import_graph(root)
    assert cross_stage_imports(graph) == ["tfmlops.stages.prune -> tfmlops.stages.quantize.tflite"]
    assert single_stage_modules(graph, ("prune", "quantize"), root) == [
        "tfmlops.core.convert: ['quantize']"]


# Every stage module has its `run(cfg)` and a command its `main`: one name, one role.
SHARED_NAMES = {"run", "main"}


def shared_public_names(root: Path) -> dict[str, list[str]]:
    """{name: modules} of each public top-level function or class defined in more than one
    module (other than SHARED_NAMES): two `first_line`s doing different things read as one."""
    where: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                    and not node.name.startswith("_") and node.name not in SHARED_NAMES:
                where.setdefault(node.name, []).append(str(path.relative_to(root)))
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def test_no_two_modules_define_the_same_public_name():
    assert shared_public_names(SRC) == {}


def test_shared_public_names_finds_a_repeated_one(tmp_path):
    (tmp_path / "a.py").write_text("def first_line(exc):\n    pass\n\ndef run(cfg):\n    pass\n")
    (tmp_path / "b.py").write_text("def first_line(text):\n    pass\n\ndef run(cfg):\n    pass\n")
    assert shared_public_names(tmp_path) == {"first_line": ["a.py", "b.py"]}


# Libraries only the tests use: train implements confident learning in numpy, and cleanlab
# (the `test` extra) is the reference its tests compare with, never a dependency of the package.
TEST_ONLY = ("cleanlab",)


def imports_of_test_only(root: Path) -> list[str]:
    """`module: name` for each import of a TEST_ONLY library below `root`, at any level."""
    found = []
    for module, path in module_names(root).items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            found += [f"{module}: {n}" for n in names if n.split(".")[0] in TEST_ONLY]
    return found


def test_the_package_imports_no_test_only_library():
    assert imports_of_test_only(SRC) == []


def test_a_test_only_import_inside_a_function_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from cleanlab.filter import x\n")
    assert imports_of_test_only(tmp_path / "pkg") == ["pkg.a: cleanlab.filter"]
