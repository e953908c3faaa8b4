"""What lets Beam fold prepare's outputs without the driver holding a per-file list
(issue 52): the train split's sums are exact, so any order of adding gives the local
engine's stats.json; and `files.write_json_streamed` writes `write_json`'s bytes item by
item, so manifest.json and quarantine.json are streamed."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tfmlops.data.store import Stored
from tfmlops.files import write_json, write_json_streamed
from tfmlops.stages.prepare.stream import Tally, as_float, exact_sum

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=300, deadline=None)
@given(finite)
def test_a_float_goes_through_an_exact_sum_unchanged(x):
    assert as_float(exact_sum(x)) == x


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e6), st.floats(0, 1e12)), min_size=2, max_size=40),
       st.randoms(use_true_random=False))
def test_the_train_statistics_do_not_depend_on_the_order_of_adding_or_merging(values, rnd):
    """In order, reversed, shuffled and split in two merged tallies (a Beam combiner's
    way): the same mean and std to the bit. Plant: float sums fail it (e.g. 1e16, 1, -1e16
    in two orders)."""
    stored = [Stored(None, sums=(s, s / 3), squares=(q, q / 7), pixels=64) for s, q in values]

    def tally(items) -> Tally:
        t = Tally(None)
        for item in items:
            t.add_train_stats(item)
        return t

    shuffled = stored[:]
    rnd.shuffle(shuffled)
    cut = len(shuffled) // 2
    merged = tally(shuffled[:cut]).merge(tally(shuffled[cut:]))
    outputs = {json.dumps(t.mean_std()) for t in (tally(stored), tally(stored[::-1]), merged)}
    assert len(outputs) == 1


def test_exact_sums_differ_from_float_sums_where_floats_lose_bits():
    values = [1e16, 1.0, -1e16]
    assert as_float(sum(map(exact_sum, values))) == 1.0 != sum(values)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | finite | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=12),
       st.lists(st.dictionaries(st.text(max_size=5), finite | st.text(max_size=6), max_size=4),
                max_size=5),
       st.booleans())
def test_a_streamed_list_is_written_with_write_json_bytes(tmp_path_factory, other, items, top):
    folder = tmp_path_factory.mktemp("json")
    data = items if top else {"files": items, "other": other, "a": 1}
    write_json(folder / "whole.json", data)
    write_json_streamed(folder / "streamed.json", iter(items) if top else
                        {**data, "files": iter(items)}, None if top else "files")
    assert (folder / "streamed.json").read_bytes() == (folder / "whole.json").read_bytes()



@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.tuples(st.text("ab/é", max_size=4), st.integers(0, 9)),
                         max_size=6), min_size=1, max_size=9),
       st.integers(2, 4))
def test_the_manifest_rows_of_many_parts_merge_in_order_a_few_open_at_once(
        tmp_path_factory, parts, fan_in):
    """Beam's shard writers leave one sorted rows part per shard (up to 3,072); the driver
    merges them `fan_in` at a time, in rounds, into the manifest's one sorted stream."""
    from tfmlops.stages.prepare.beam_fold import ROWS, merged_rows

    base = tmp_path_factory.mktemp("parts")
    for i, rows in enumerate(parts):
        (base / f"{ROWS}{i:05d}.jsonl").write_text(
            "".join(json.dumps(list(r)) + "\n" for r in sorted(set(rows))))
    expected = sorted(r for rows in parts for r in set(rows))
    assert list(merged_rows(str(base), fan_in)) == expected
