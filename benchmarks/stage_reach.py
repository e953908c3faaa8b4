"""What a reader opens to follow a stage from the CLI to its output, at two revisions:
the package's modules a stage's entry module imports, transitively (issue 49).

    python benchmarks/stage_reach.py --before b0a5723 --after HEAD [--stages train prepare promote]

A stage's entry is `tfmlops.stages.<name>` (a module before the stage folders, a
package after). Imports are read with `ast` from `git show`, nothing is imported; an
import inside a function counts (the stages import their work lazily), one under
`TYPE_CHECKING` does not. Printed per stage: the modules reached and their lines, then
those no other pipeline stage reaches, and the folders they sit in (one: the stage's code
is in one place).
"""

from __future__ import annotations

import argparse
import ast
import subprocess

from common import ROOT


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def sources(rev: str) -> dict[str, str]:
    """module name -> source text of every src/tfmlops/**/*.py at `rev`."""
    found = {}
    for path in git("ls-tree", "-r", "--name-only", rev, "src/tfmlops").split():
        if path.endswith(".py"):
            name = path[len("src/"):-len(".py")].replace("/", ".")
            found[name.removesuffix(".__init__")] = git("show", f"{rev}:{path}")
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(name: str, text: str, known: set[str]) -> set[str]:
    """The package's modules `name` imports (outside TYPE_CHECKING blocks)."""
    package = name if f"{name}.__init__" in known or any(k.startswith(f"{name}.") for k in known) \
        else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            targets = []
        for target in targets:
            if target in known:
                found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(text))
    found.discard(name)
    return found


def reach(start: str, code: dict[str, str]) -> set[str]:
    known = set(code)
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in code:
            continue
        seen.add(name)
        for parent in _parents(name, known):  # importing a.b.c runs a/__init__ and a/b/__init__
            todo.append(parent)
        todo.extend(imports(name, code[name], known))
    return seen


def _parents(name: str, known: set[str]) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in known]


def folder(name: str, known: set[str]) -> str:
    """The package folder a module's file sits in (a package's __init__: its own)."""
    return name if any(k.startswith(f"{name}.") for k in known) else name.rpartition(".")[0]


PIPELINE = ("materialize", "prepare", "tune", "train", "prune", "quantize", "export", "promote")


def measure(rev: str, stage: str) -> dict:
    """`only`: the modules this stage reaches and no other stage does, and the folders
    they sit in (a stage's own code in one place: 1)."""
    code = sources(rev)
    reached = {s: reach(f"tfmlops.stages.{s}", code) for s in PIPELINE}
    mine = reached[stage]
    others = set().union(*(reached[s] for s in PIPELINE if s != stage))
    only = mine - others
    return {"modules": len(mine), "lines": sum(len(code[m].splitlines()) for m in mine),
            "only": len(only), "only_lines": sum(len(code[m].splitlines()) for m in only),
            "only_folders": sorted({folder(m, set(code)) for m in only})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--stages", nargs="+", default=["train", "prepare", "promote"])
    args = ap.parse_args()
    print(f"{'stage':9} {'rev':9} {'reached':>7} {'lines':>7} {'only it':>7} {'lines':>6}  "
          "folders holding what only it reaches")
    for stage in args.stages:
        for rev in (args.before, args.after):
            m = measure(rev, stage)
            print(f"{stage:9} {rev[:9]:9} {m['modules']:>7} {m['lines']:>7,} {m['only']:>7} "
                  f"{m['only_lines']:>6,}  {len(m['only_folders'])}: "
                  f"{', '.join('src/' + f.replace('.', '/') for f in m['only_folders'])}")


if __name__ == "__main__":
    main()
