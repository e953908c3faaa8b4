"""prepare on Apache Beam: what the workers fold and write so that the driver holds
nothing per file.

- The tally (counts, sizes, encodings, the profile's histograms, the train split's
  exact sums) is folded by a combiner (`TallyFold`): every piece is an integer or an
  exact sum, so the order of merging never shows and it is the local engine's tally.
- The manifest's files are written by the shard writers, one part per shard sorted by
  file (`write_rows_part`); the driver merges the parts as it writes the manifest
  (`SortedRows`, heapq.merge: one row per part in memory).
- The refused files, the leakage search and the cross-class duplicate check need all
  their rows at once: each runs on one worker, which writes its result as a part.

Every part is written and read through Beam's filesystems under `base`, the run's
staging prefix (beam_staging: a URL or a shared mount; the workers' functions are
wrapped by `beam_staging.on_workers`). The driver reads them in `read_results`.
"""

from __future__ import annotations

import heapq
import json
import pickle

import apache_beam as beam

from tfmlops.stages.prepare import beam_staging as staging
from tfmlops.stages.prepare.manifest import SortedRows
from tfmlops.stages.prepare.stream import Tally, fold, manifest_row

TALLY = "tally.pickle"
QUARANTINE_ROWS = "quarantine.jsonl"
ROWS = "rows-"  # + split-shard.jsonl: one shard's manifest rows, sorted by file
MERGED = "merged-"  # + round-index.jsonl: rows parts merged, when there are many
FAN_IN = 128  # parts open at once while the driver merges them
LEAKAGE = "leakage.json"
ACROSS = "across.json"  # contents in more than one class folder: (count, example files)
LISTED = "listed.json"  # how many files the workers listed: each must come back folded


def write_part(base: str, name: str, data: bytes) -> None:
    with staging.create(staging.join(base, name)) as fh:
        fh.write(data)


def read_part(base: str, name: str) -> bytes:
    with staging.open_staged(staging.join(base, name)) as fh:
        return fh.read()


class TallyFold(beam.CombineFn):
    """Every file's row (no pixels) folded into [Tally, refused files]."""

    def __init__(self, profile_side: int | None):
        self.profile_side = profile_side  # data.contract.tiny.side; None: no profile

    def create_accumulator(self):
        from tfmlops.stages.prepare.data_profile import Profile

        side = self.profile_side
        return [Tally(None, None if side is None else Profile(side, keep_hashes=False)), 0]

    def add_input(self, acc, row):
        tally = acc[0]
        if row["sha"] is not None:
            tally.hashed += 1
            tally.decoded += 1
            tally.source_bytes += row["size"]
        if row["reason"]:
            acc[1] += 1
        else:
            fold(tally, row["file"], row["sha"], row["label"], row["split"], row["stored"],
                 row["stored_bytes"], keep_row=False)
        return acc

    def merge_accumulators(self, accumulators):
        out = self.create_accumulator()
        for tally, bad in accumulators:
            out[0].merge(tally)
            out[1] += bad
        return out

    def extract_output(self, acc):
        return acc


class AcrossClasses(beam.CombineFn):
    """(count, files of the first by hash) of contents found in several class folders."""

    def create_accumulator(self):
        return (0, None)

    def add_input(self, acc, shared):  # shared: (sha, its files sorted)
        return (acc[0] + 1, shared if acc[1] is None else min(acc[1], shared))

    def merge_accumulators(self, accumulators):
        count, best = 0, None
        for n, found in accumulators:
            count += n
            best = found if best is None else best if found is None else min(best, found)
        return (count, best)

    def extract_output(self, acc):
        return acc


def shared_content(group):
    """One content's (sha, sorted files) if it sits in more than one class folder."""
    sha, found = group
    found = list(found)
    if len({label for label, _ in found}) > 1:
        yield sha, sorted(file for _, file in found)


def write_rows_part(base: str, name: str, rows: list[dict]) -> None:
    """One shard's manifest rows (good files), sorted by file, as JSON lines."""
    lines = sorted(manifest_row(r["file"], r["sha"], r["label"], r["split"], r["stored"])
                   for r in rows)
    write_part(base, f"{ROWS}{name}.jsonl", b"".join(json.dumps(list(line)).encode() + b"\n"
                                                     for line in lines))


def write_refused(rows: list[dict], base: str) -> None:
    """The refused files in quarantine.json's order: those refused when read (their
    listing order), then those refused by what they are (symlinks), as JSON lines; none
    refused: no part (S3 cannot store an empty object through Beam; `StreamedList` reads
    nothing then)."""
    rows = sorted(rows, key=lambda r: (r["listed"], r["key"]))
    if not rows:
        return
    write_part(base, QUARANTINE_ROWS, b"".join(
        json.dumps({"file": r["file"], "label": r["label"], "reason": r["reason"]}).encode()
        + b"\n" for r in rows))


def leakage_facts(row: dict) -> tuple:
    """What the leakage search needs of a good file, in its write order's sort key first."""
    return (row["sha"], row["key"], row["stored"].phash, row["split"], row["file"], row["label"])


def write_leakage(facts: list[tuple], base: str, params) -> None:
    """The leakage search over the good files (`leakage_facts`), in the local engine's
    write order (content hash, then listing)."""
    from tfmlops.stages.prepare.contract import leakage_report
    from tfmlops.stages.prepare.images import SPLITS

    facts = sorted(facts)  # Beam's inputs are not to be changed in place
    found = leakage_report(params, [f[2] for f in facts], [SPLITS.index(f[3]) for f in facts],
                           [(f[4], f[0], f[5], f[3]) for f in facts])
    write_part(base, LEAKAGE, json.dumps(found).encode())


def write_tally(acc, base: str) -> None:
    write_part(base, TALLY, pickle.dumps(acc, protocol=pickle.HIGHEST_PROTOCOL))


def write_across(acc, base: str) -> None:
    write_part(base, ACROSS, json.dumps(acc).encode())


def write_listed(count: int, base: str) -> None:
    write_part(base, LISTED, json.dumps(count).encode())


def check_all_folded(base: str, tally: Tally) -> None:
    """Every file the workers listed came back folded, good or refused: a row lost
    between the listing and the fold (a bug) fails the run before anything is swapped in."""
    from tfmlops.errors import DataError

    listed = json.loads(read_part(base, LISTED))
    if tally.good + len(tally.bad) != listed:
        raise DataError(f"prepare on Apache Beam folded {tally.good + len(tally.bad)} files "
                        f"of the {listed} it listed; nothing was swapped in (a bug: please "
                        "report it)")


class StreamedList:
    """A list written as a part, JSON lines: its length known, its items read as iterated."""

    def __init__(self, base: str, name: str, count: int):
        self.base, self.name, self.count = base, name, count

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        if not self.count:  # nothing written (write_refused)
            return
        with staging.open_staged(staging.join(self.base, self.name)) as fh:
            for line in fh:
                yield json.loads(line)


def _rows_of(path: str):
    with staging.open_staged(path) as fh:
        for line in fh:
            yield tuple(json.loads(line))


def merged_rows(base: str, fan_in: int = FAN_IN):
    """Every shard's manifest rows, merged in file order: one row per part in memory.
    Up to 3 x 1,024 shards' parts: merged `fan_in` at a time into bigger parts first,
    so that no more files than that are open at once."""
    parts = [path for path, _ in staging.listing(staging.join(staging.literal(base),
                                                              ROWS + "*"))]
    round_ = 0
    while len(parts) > fan_in:
        merged = []
        for i in range(0, len(parts), fan_in):
            name = staging.join(base, f"{MERGED}{round_}-{i // fan_in:05d}.jsonl")
            with staging.create(name) as fh:
                for row in heapq.merge(*(_rows_of(p) for p in parts[i:i + fan_in])):
                    fh.write(json.dumps(list(row)).encode() + b"\n")
            merged.append(name)
        parts, round_ = merged, round_ + 1
    return heapq.merge(*(_rows_of(p) for p in parts))


def read_results(base: str, leakage_searched: bool) -> tuple[Tally, tuple]:
    """The driver's tally from the parts: counts and sums, the rows and refused files
    as streams, the leakage found; and (count, example files) of cross-class contents."""
    tally, bad = pickle.loads(read_part(base, TALLY))
    tally.rows = SortedRows(lambda: merged_rows(base))
    tally.bad = StreamedList(base, QUARANTINE_ROWS, bad)
    if leakage_searched:
        tally.leakage = json.loads(read_part(base, LEAKAGE))
    return tally, tuple(json.loads(read_part(base, ACROSS)))
