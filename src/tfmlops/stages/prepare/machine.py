"""What this machine allows: open files and cores, for params that multiply them.

`prepare` (local engine) writes `data.shards` files per split (three splits) and
starts `data.workers` decoding processes. The params' bounds are static (1,024
each, config.sections.data): a params.yaml valid on a 16-core workstation is valid
on a 2-core CI runner, so `tfmlops check` and `dvc exp run` never depend on the
machine. `prepare` fits them to this machine when it runs (`fit_to_machine`), with
one warning line: at most twice the cores of decoding processes, and, when the
open-files limit cannot hold every shard open (raised up to the hard limit first),
fewer shard files open at once. Neither changes a byte of the output: which shard
a record goes to is a function of its content hash alone (data.stream.shard_of).
"""

from __future__ import annotations

import logging
import os

SPLITS = 3  # train, val, test: each keeps its shards open while prepare writes
FILES_HELD = 64  # beyond the shards: the interpreter, libraries, the pool's pipes
WORKERS_PER_CORE = 2  # more decoding processes than that only add memory
log = logging.getLogger(__name__)


def files_needed(shards: int) -> int:
    return SPLITS * shards + FILES_HELD


def open_files_limits() -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE; an unlimited hard limit as a large number."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    big = 1 << 30
    return (big if soft == resource.RLIM_INFINITY else soft,
            big if hard == resource.RLIM_INFINITY else hard)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def most_workers() -> int:
    """Decoding processes beyond this only add memory."""
    return WORKERS_PER_CORE * cores()


def fit_to_machine(shards: int, workers: int) -> tuple[int, int]:
    """(decoding processes, shard files each split keeps open at once) for data.workers
    and data.shards on this machine (0 workers: still automatic); when either is cut,
    one warning line says so. The soft open-files limit is raised first."""
    allow_open_files(shards)
    soft = open_files_limits()[0]
    open_max = max(1, min(shards, (soft - FILES_HELD) // SPLITS))
    cut = []
    if workers > most_workers():
        cut.append(f"data.workers {workers} -> {most_workers()} processes ({cores()} cores)")
        workers = most_workers()
    if open_max < shards:
        cut.append(f"data.shards {shards} written with at most {open_max} open per split "
                   f"(they need {files_needed(shards)} open files, this machine allows "
                   f"{soft}: `ulimit -Hn`; slower writes)")
    if cut:
        log.warning("prepare: fitted to this machine: " + "; ".join(cut)
                    + "; the output is the same")
    return workers, open_max


def allow_open_files(shards: int) -> None:
    """Raise this process's soft open-files limit to what `shards` need (up to the hard
    limit)."""
    import resource

    soft, hard = open_files_limits()
    need = files_needed(shards)
    if need > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))
