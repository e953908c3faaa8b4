"""What `tfmlops compare` shows of a comparison (compare.py): its tables as text for the
terminal, as Markdown and HTML for its run (compare.md, compare.html), its JSON, the
listed flipped images' source files and thumbnails, and the run's metrics."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from tfmlops.artifacts import COMPARE_HTML, COMPARE_JSON, COMPARE_MD, read_manifest
from tfmlops.files import write_bytes, write_json, write_text
from tfmlops.stages.promote.history import aligned

THUMB_MIN, THUMB_MAX = 64, 128  # a thumbnail's longer side: smaller scaled up, larger down
IMAGE = "image"  # the thumbnail column (a path relative to compare.md): not in the text table
TEXT_CELL = 60  # a text table's widest cell


def write_comparison(folder: Path, result: dict) -> None:
    """compare.json, compare.md and compare.html in `folder` (beside the thumbnails)."""
    write_json(folder / COMPARE_JSON, result)
    write_text(folder / COMPARE_MD, markdown(result))
    write_text(folder / COMPARE_HTML, as_html(result, folder))


def run_metrics(r: dict) -> dict:
    if r["kind"] == "runs":
        return {"params_differ": len(r["params"])}
    accuracy = next(m for m in r["metrics"] if m["metric"] == "accuracy")
    return {"images": r["images"], "accuracy.a": accuracy["a"], "accuracy.b": accuracy["b"],
            "accuracy.delta": accuracy["delta"],
            **{f"flipped.{k}": v for k, v in r["flipped"].items() if k != "listed"}}


def title(r: dict) -> str:
    if r["kind"] == "runs":
        return f"tfmlops compare: run {r['a']['run_id'][:8]} vs run {r['b']['run_id'][:8]}"
    return f"tfmlops compare: {r['model']} version {r['a']['version']} vs {r['b']['version']}"


def headline(r: dict) -> str:
    if r["kind"] == "runs":
        return (f"run {r['a']['run_id']} ({r['a']['name']}, A) vs run {r['b']['run_id']} "
                f"({r['b']['name']}, B): {len(r['params'])} params differ")
    accuracy = next(m for m in r["metrics"] if m["metric"] == "accuracy")
    f = r["flipped"]
    return (f"{r['model']} version {r['a']['version']} (A) vs version {r['b']['version']} (B) on "
            f"the same {r['images']} test images: accuracy {fmt(accuracy['a'])} -> "
            f"{fmt(accuracy['b'])} ({signed(accuracy['delta'])}); {f['total']} flipped: "
            f"{f['fixed']} fixed, {f['broken']} broken, {f['changed']} changed (both wrong)")


def notes(r: dict) -> list[str]:
    """The lines under the headline: what A and B are, and how the images were chosen."""
    if r["kind"] == "runs":
        return [f"{x.upper()}: run {r[x]['run_id']} ({r[x]['name']}, stage {r[x]['stage'] or '-'})"
                for x in "ab"]
    p, f = r["paired"], r["flipped"]
    return [*(f"{x.upper()}: version {r[x]['version']}, served by {r[x]['runtime']}" for x in "ab"),
            f"B - A: {signed(p['difference'])} = (fixed - broken) / images, {p['confidence']:.0%} "
            f"interval [{signed(p['low'])}, {signed(p['high'])}] ({p['method']})",
            f"images: {r['images']} of the current test split ({r['excluded']} left out: "
            f"{r['exclusion']})",
            f"flipped images listed: {len(f['listed'])} of {f['total']} (--flipped)"]


def sections(r: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(heading, header, rows of cells) of each table."""
    out = [("params that differ", ["stage", "param", "A", "B"],
            [[p["stage"], p["param"], str(p["a"]), str(p["b"])] for p in r["params"]]),
           ("metrics", ["metric", "A", "B", "B - A", "measured"],
            [[m["metric"], fmt(m["a"]), fmt(m["b"]), signed(m["delta"]), m["measured"]]
             for m in r["metrics"]])]
    if r["kind"] == "versions":
        scores = [f"{k} {x}" for k in ("recall", "precision", "f1") for x in ("A", "B", "B - A")]
        out.append(("per class", ["class", "images", *scores], [
            [c["class"], str(c["images"]), *(f(c[f"{k}_{x}"]) for k in ("recall", "precision", "f1")
                                            for x, f in (("a", fmt), ("b", fmt), ("delta", signed)))]
            for c in r["per_class"]]))
        out.append(("flipped images", [IMAGE, "kind", "label", "A", "B", "sha256", "file"], [
            [f.get("thumbnail", ""), f["kind"], f["label"],
             f"{f['a_predicted']} ({f['a_confidence']:.2f})",
             f"{f['b_predicted']} ({f['b_confidence']:.2f})", f["sha256"][:16], f.get("file") or "-"]
            for f in r["flipped"]["listed"]]))
    return out


def text(r: dict) -> str:
    """The terminal's tables, without the thumbnails, a long value (a param's JSON list)
    cut to TEXT_CELL characters: compare.md and compare.json hold it whole."""
    lines = [headline(r), *(f"  {n}" for n in notes(r))]
    for heading, header, rows in sections(r):
        keep = [i for i, h in enumerate(header) if h != IMAGE]
        cut = [[_cut(line[i]) for i in keep] for line in [header, *rows]]
        lines += ["", f"{heading}:", aligned(cut) if rows else "  none"]
    return "\n".join(lines)


def _cut(cell: str) -> str:
    return cell if len(cell) <= TEXT_CELL else cell[:TEXT_CELL - 3] + "..."


def markdown(r: dict) -> str:
    lines = [f"# {title(r)}", "", headline(r), "", *(f"- {n}" for n in notes(r))]
    for heading, header, rows in sections(r):
        lines += ["", f"## {heading}", ""]
        if not rows:
            lines.append("none")
            continue
        lines += [_md_row(header), "|" + "---|" * len(header)]
        lines += [_md_row([f"![{line[header.index('sha256')]}]({c})" if h == IMAGE and c else c
                           for h, c in zip(header, line, strict=True)]) for line in rows]
    return "\n".join(lines) + "\n"


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def as_html(r: dict, folder: Path) -> str:
    """One self-contained page: the thumbnails inline, as the MLflow UI shows an artifact."""
    e = html.escape
    parts = ["<!doctype html><meta charset='utf-8'>", f"<title>{e(title(r))}</title>",
             "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px "
             "solid #ccc;padding:2px 6px;text-align:left}img{image-rendering:pixelated}</style>",
             f"<h1>{e(title(r))}</h1><p>{e(headline(r))}</p><ul>",
             *(f"<li>{e(n)}</li>" for n in notes(r)), "</ul>"]
    for heading, header, rows in sections(r):
        parts.append(f"<h2>{e(heading)}</h2>")
        if not rows:
            parts.append("<p>none</p>")
            continue
        parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{_inline(folder, c) if h == IMAGE else e(c)}</td>"
                                   for h, c in zip(header, line, strict=True)) + "</tr>" for line in rows]
        parts.append("</table>")
    return "\n".join(parts) + "\n"


def _inline(folder: Path, relative: str) -> str:
    if not relative:
        return ""
    data = base64.b64encode((folder / relative).read_bytes()).decode()
    return f"<img width='{THUMB_MIN}' src='data:image/png;base64,{data}'>"


def illustrate(prepared, listed: list[dict], folder: Path, subfolder: str) -> None:
    """Each listed flipped image gets its source file(s) from prepare's manifest ("; "
    between several of one content) and a PNG thumbnail in folder/subfolder (its path
    relative to `folder`): one pass over the test split's stored bytes, stopping once
    all are found."""
    from tfmlops.data.stored_split import stored_records

    wanted = {f["sha256"]: f for f in listed}
    files: dict[str, list[str]] = {}
    for f in read_manifest(prepared)["files"]:
        if f.get("split") == "test" and f["sha256"] in wanted:
            files.setdefault(f["sha256"], []).append(f["file"])
    for sha, row in wanted.items():
        row["file"] = "; ".join(sorted(files.get(sha, [])))
    made: set[str] = set()
    for shas, encoded, _ in stored_records(prepared, "test") if wanted else ():
        for sha, data in zip(shas, encoded, strict=True):
            if sha in wanted and sha not in made:
                relative = f"{subfolder}/{sha[:16]}.png"
                write_bytes(folder / relative, thumbnail_png(data))
                wanted[sha]["thumbnail"] = relative
                made.add(sha)
        if len(made) == len(wanted):
            break


def thumbnail_png(data: bytes) -> bytes:
    """A stored image as a PNG whose longer side is between THUMB_MIN (small digits
    scaled up, pixels kept sharp) and THUMB_MAX."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img.load()
        side = max(img.size)
        if side < THUMB_MIN:
            factor = -(-THUMB_MIN // side)
            img = img.resize((img.width * factor, img.height * factor), Image.NEAREST)
        elif side > THUMB_MAX:
            img.thumbnail((THUMB_MAX, THUMB_MAX))
        buf = io.BytesIO()
        img.save(buf, "PNG")
    return buf.getvalue()


def fmt(v) -> str:
    return "-" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def signed(v) -> str:
    return "-" if v is None else f"{v + 0.0:+.6g}"  # + 0.0: -0.0 shows as +0
