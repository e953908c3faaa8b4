"""The project's pages point at places that exist: the README's reference lives in docs/
pages, and a section that moves must not leave links, or comments and messages naming it,
pointing at nothing. Checked on the checkout's text:

- every relative Markdown link of README.md, docs/*.md, BENCHMARKS.md and CHANGELOG.md
  names a file that exists and, after `#`, a heading of that file (GitHub's anchor);
- every `docs/<page>.md` named in the code, tests, benchmarks, params or pages exists;
- every section named by its title beside its page (`README, "Your own images"`,
  `BENCHMARKS.md ("Photos")`) starts a heading of that page.
"""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "CHANGELOG.md",
         *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
DOCS_PATH = re.compile(r"\bdocs/[\w.-]+\.md\b")
# A page, then a section's title in quotes: `README, "X"`, `BENCHMARKS.md ("X")`.
SECTION = re.compile(r"\b(README(?:\.md)?|docs/[\w-]+\.md|BENCHMARKS(?:\.md)?)[,:]?\s+\(?\"([^\"]+)\"")


def texts() -> dict[Path, str]:
    """Every file that may name a page or a section: the pages, the code, the tests (this
    one left out: its docstring shows the forms it looks for), benchmarks and params."""
    files = [*PAGES, ROOT / "params.yaml", ROOT / "dvc.yaml"]
    for folder in ("src", "tests", "benchmarks"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return {f: f.read_text() for f in files if f.resolve() != Path(__file__).resolve()}


def headings(page: Path) -> list[str]:
    """The page's headings outside fenced code, as written (without the leading #s)."""
    found, fenced = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            found.append(m.group(1))
    return found


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces to
    hyphens; a repeated one gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in headings(page):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        out.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return out


def page_file(name: str) -> Path:
    return ROOT / (name if name.endswith(".md") else f"{name}.md")


def test_relative_links_reach_a_file_and_a_heading():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and anchor not in anchors(linked):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_named_docs_pages_exist():
    missing = sorted({f"{f.relative_to(ROOT)}: {name}" for f, text in texts().items()
                      for name in DOCS_PATH.findall(text) if not (ROOT / name).exists()})
    assert not missing, "\n".join(missing)


def test_named_sections_exist():
    def plain(s: str) -> str:
        return " ".join(s.replace("`", "").split()).lower()

    missing = []
    for f, text in texts().items():
        for page, title in SECTION.findall(text):
            if not any(plain(h).startswith(plain(title)) for h in headings(page_file(page))):
                missing.append(f'{f.relative_to(ROOT)}: {page}, "{title}"')
    assert not missing, "\n".join(missing)
