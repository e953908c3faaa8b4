"""The package's lines at two revisions, and the net lines of the commits between them
whose subjects match a pattern (issue 26: "lines of the package before and after").

    python benchmarks/package_lines.py --before 7607d1c --after HEAD \
        [--features 'issue 2[789]|data contract|Beam|...']

Lines are counted as `wc -l` counts them (every line of every `src/tfmlops/**/*.py`),
then split into blank, comment, docstring and code lines (read with `ast`, nothing
imported). `--features` names the commits that added features filed after `--before`:
their net lines (added minus removed under src/, merges left out: their commits count
once each) are subtracted from `--after` for a like-for-like figure. The match is by
commit subject, so the list it prints is what to check.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess

from common import ROOT


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def split(rev: str) -> dict[str, int]:
    """Lines of the package at `rev`: total (wc -l) and its blank/comment/docstring/code."""
    counts = dict.fromkeys(("files", "total", "blank", "comment", "docstring"), 0)
    for path in git("ls-tree", "-r", "--name-only", rev, "src/tfmlops").split():
        if not path.endswith(".py"):
            continue
        text = git("show", f"{rev}:{path}")
        lines = text.splitlines()
        counts["files"] += 1
        counts["total"] += len(lines)
        counts["blank"] += sum(1 for line in lines if not line.strip())
        counts["comment"] += sum(1 for line in lines if line.strip().startswith("#"))
        for node in ast.walk(ast.parse(text)):
            body = getattr(node, "body", None)
            if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                    and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
                counts["docstring"] += body[0].end_lineno - body[0].lineno + 1
    counts["code"] = counts["total"] - counts["blank"] - counts["comment"] - counts["docstring"]
    return counts


def matching_commits(before: str, after: str, pattern: str) -> list[tuple[str, int, str]]:
    """(hash, net src lines, subject) of each non-merge commit whose subject matches."""
    found = []
    for line in git("log", "--no-merges", "--format=%h %s", f"{before}..{after}").splitlines():
        commit, subject = line.split(" ", 1)
        if not re.search(pattern, subject, re.IGNORECASE):
            continue
        numstat = git("diff", "--numstat", f"{commit}~1", commit, "--", "src")
        net = sum(int(a) - int(r) for a, r, _ in (row.split("\t", 2) for row in numstat.splitlines())
                  if a != "-")
        found.append((commit, net, subject))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--features", help="regex over commit subjects: features filed later")
    args = parser.parse_args()
    result = {"before": {"rev": args.before, **split(args.before)},
              "after": {"rev": args.after, **split(args.after)}}
    print(f"{'':10}{'files':>7}{'total':>8}{'blank':>8}{'comment':>9}{'docstring':>11}{'code':>8}")
    for side in ("before", "after"):
        c = result[side]
        print(f"{c['rev']:10}{c['files']:>7}{c['total']:>8,}{c['blank']:>8,}{c['comment']:>9,}"
              f"{c['docstring']:>11,}{c['code']:>8,}")
    if args.features:
        commits = matching_commits(args.before, args.after, args.features)
        added = sum(net for _, net, _ in commits)
        for commit, net, subject in commits:
            print(f"  {net:+6d} {commit} {subject[:90]}")
        like_for_like = result["after"]["total"] - added
        print(f"features' commits: {len(commits)}, net {added:+,} lines; {args.after} without them: "
              f"{like_for_like:,} vs {result['before']['total']:,} "
              f"({like_for_like / result['before']['total'] - 1:+.1%})")
        result["features"] = {"pattern": args.features, "commits": len(commits), "net_lines": added,
                              "after_without_features": like_for_like}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
