"""What this machine allows: open files and cores, for params that multiply them.

`prepare` holds every shard of the three splits open at once (`data.shards` x 3
files, plus what the process and its pool already hold) and starts
`data.workers` decoding processes. The params' own bounds (1,024 each) are far
above what most machines take, so the data section is checked against this
machine when params are read (`tfmlops check` and every stage): shards beyond
the hard open-files limit and workers beyond twice the cores are refused with
the number this machine takes. A soft open-files limit below what the shards
need is raised by `prepare` itself (`allow_open_files`), up to the hard one.
"""

from __future__ import annotations

import os

SPLITS = 3  # train, val, test: each keeps its shards open while prepare writes
FILES_HELD = 64  # beyond the shards: the interpreter, libraries, the pool's pipes
WORKERS_PER_CORE = 2  # more decoding processes than that only add memory


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


def check_data(shards: int, workers: int) -> str | None:
    """Why this machine cannot run prepare with these params (the `{p}`-prefixed keys
    of a config rule), or None."""
    hard = open_files_limits()[1]
    if files_needed(shards) > hard:
        most = (hard - FILES_HELD) // SPLITS
        return (f"{{p}}shards {shards} holds {files_needed(shards)} files open at once "
                f"({SPLITS} splits x {shards} + {FILES_HELD}); this machine allows {hard} "
                f"(hard limit of open files, `ulimit -Hn`): use at most {most}")
    most = WORKERS_PER_CORE * cores()
    if workers > most:
        return (f"{{p}}workers {workers} is more than this machine's {cores()} cores take "
                f"(at most {most}; 0: one per core)")
    return None


def allow_open_files(shards: int) -> None:
    """Raise this process's soft open-files limit to what `shards` need (up to the hard
    limit, which `check_data` already compared)."""
    import resource

    soft, hard = open_files_limits()
    need = files_needed(shards)
    if need > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), resource.getrlimit(
            resource.RLIMIT_NOFILE)[1]))
