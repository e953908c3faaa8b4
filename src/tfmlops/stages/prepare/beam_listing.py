"""prepare on Apache Beam: the listing, read by the workers.

The driver lists only the class folders of a local `data.image_dir` (`images.list_classes`:
O(classes)), or nothing of a folder URL (Beam's S3 and GCS listings hold every key of
a prefix in memory, so a driver listing only the classes through them would still hold
them all); it hands those to `beam.Create`. A worker expands each: one class folder on
disk (`images.list_class`: symlinks judged as the local listing judges them), or the
whole folder URL (`images.list_keys` through Beam's filesystems: every untrusted key
checked, in key order). Each file becomes an entry with its sort key, the tuple of its
path's components below data.image_dir, whose order is the local listing's (the
deterministic tie-break the local engine takes from its list index).

A listing that must fail the run (a name prepare cannot use, an empty class folder,
fewer than 2 classes) fails the worker; first it writes its one-line message through Beam's filesystems
beside the parts, under the run's staging prefix, where the driver finds it
(`listing_refusal`): the user sees that line, not Beam's traceback.
"""

from __future__ import annotations

from pathlib import Path

from tfmlops.errors import DataError
from tfmlops.stages.prepare.beam_staging import error_line

REFUSED = "listing-refused-"  # + a class index or "url" + ".txt", in the parts folder
CLASSES = "classes.json"  # in the parts folder: the classes the workers found


def listing_items(image_dir, classes: list[str] | None) -> list[tuple[str, str | None]]:
    """What the driver hands to `beam.Create`: (folder, class) per class folder on disk,
    or the folder URL alone (classes None: the workers find them)."""
    if classes is None:
        return [(str(image_dir), None)]
    return [(str(image_dir), cls) for cls in classes]


def expand(item: tuple[str, str | None], base: str):
    """On a worker: the entries (sort key, path, class, reason refused or None) of one
    class folder, or of a folder URL; a URL's classes as the tagged output `classes`."""
    import apache_beam as beam

    root, cls = item
    try:
        if cls is None:
            classes, entries = _expand_url(root)
            for name in classes:
                yield beam.pvalue.TaggedOutput("classes", name)
        else:
            entries = _expand_class(root, cls)
    except DataError as exc:
        _write_refusal(base, "url" if cls is None else cls, str(exc))
        raise
    yield from entries


def _expand_class(root: str, cls: str) -> list[tuple]:
    from tfmlops.stages.prepare.images import list_class

    folder = Path(root)
    found, refused = list_class(folder, cls)
    return [(p.relative_to(folder).parts, str(p), cls, None) for p in found] + \
        [(b.path.relative_to(folder).parts, str(b.path), cls, b.reason) for b in refused]


def _expand_url(url: str) -> tuple[list[str], list[tuple]]:
    from apache_beam.io.filesystems import FileSystems

    from tfmlops.stages.prepare.images import list_keys

    root = url.rstrip("/")
    try:
        found = FileSystems.match([root + "/**"])[0].metadata_list
    except Exception as exc:  # noqa: BLE001 - the store's own error, in one line
        raise DataError(f"data.image_dir {url} cannot be listed ({error_line(exc)}); check the "
                        "URL and the credentials in the environment (AWS_ACCESS_KEY_ID ... or "
                        "AWS_PROFILE; GOOGLE_APPLICATION_CREDENTIALS)") from None
    classes, files = list_keys(url, [m.path for m in found])  # every key checked, in order
    if len(classes) < 2:
        raise DataError(f"image folder {url} has {len(classes)} class folder(s) with files; it "
                        "needs at least 2 (one sub-folder per class)")
    return classes, [(tuple(path[len(root) + 1:].split("/")), path, label, None)
                     for path, label in files]


def _write_refusal(base: str, name: str, message: str) -> None:
    from tfmlops.stages.prepare import beam_staging as staging

    with staging.create(staging.join(base, f"{REFUSED}{name}.txt")) as fh:
        fh.write(message.encode())


def listing_refusal(base: str) -> str | None:
    """The message a worker's listing failed with (the first by class name), if one did
    (None too when the staging store cannot say: the run's own error is raised then)."""
    from tfmlops.stages.prepare import beam_staging as staging

    try:
        found = [path for path, _ in staging.listing(staging.join(staging.literal(base),
                                                                  REFUSED + "*"))]
        if not found:
            return None
        with staging.open_staged(found[0]) as fh:
            return fh.read().decode()
    except Exception:  # noqa: BLE001 - unreachable now: not a listing's refusal to show
        return None
