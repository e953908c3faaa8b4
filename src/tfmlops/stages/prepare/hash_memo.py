"""File content hashes remembered by (path, size, mtime, inode, ctime, device), as git does.

An incremental `prepare` must know every file's content hash (its cache key), but
reading and hashing every unchanged photo again cost a fifth of the wall time of
adding 1% of the images. A file whose size, modification time (ns), inode, change
time (ns) and device are the ones recorded with its hash keeps that hash; any other
file is hashed again. The change time is what catches a file rewritten in place with
its old modification time put back (`cp -p` over it, `touch -r`, an unpacked archive).

Kept in SQLite beside the image cache: lookups do not load the whole table into
memory (hundreds of thousands of files), and a write is one transaction, so a
kill leaves the previous table or the new one, never half of one.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from tfmlops import faults

RACY_NS = 2 * 10**9
StatKey = tuple[int, int, int, int, int]


def stat_key(st: os.stat_result) -> StatKey:
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_dev


def trust_cutoff() -> int:
    """Files modified at or after this time (ns) are not remembered: take it before the
    files are read. One modified again within the same timestamp tick after it was
    read would keep its stat and get a hash of bytes it no longer holds (the race git
    calls "racily clean")."""
    return time.time_ns() - RACY_NS


class HashMemo:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._db: sqlite3.Connection | None = None
        if self.path.is_file():
            try:
                self._db = sqlite3.connect(self.path)
                self._db.execute("SELECT ctime_ns, device FROM hashes LIMIT 1")
            except sqlite3.DatabaseError:  # damaged or another schema: start again
                self.close()

    def get(self, path: Path, key: StatKey) -> str | None:
        """The recorded hash of `path`, if it was recorded with the same stat `key`."""
        if self._db is None:
            return None
        row = self._db.execute("SELECT size, mtime_ns, inode, ctime_ns, device, sha256 "
                               "FROM hashes WHERE path = ?", (str(path),)).fetchone()
        return row[5] if row is not None and tuple(row[:5]) == key else None

    def replace(self, rows, cutoff: int) -> None:
        """Record `rows` [(path, stat_key, sha256)] in place of all before, in one
        transaction; files modified at or after `cutoff` (`trust_cutoff`, taken before
        they were read) are left out, to be hashed again next time."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None)  # transactions as written here
        try:
            db.execute("BEGIN")  # SQLite's DDL is transactional: all of it or none
            db.execute("DROP TABLE IF EXISTS hashes")
            db.execute("CREATE TABLE hashes (path TEXT PRIMARY KEY, size INTEGER, "
                       "mtime_ns INTEGER, inode INTEGER, ctime_ns INTEGER, device INTEGER, "
                       "sha256 TEXT)")
            db.executemany("INSERT OR REPLACE INTO hashes VALUES (?, ?, ?, ?, ?, ?, ?)",
                           ((str(p), *key, sha) for p, key, sha in rows if key[1] < cutoff))
            faults.point("memo.begin")
            db.execute("COMMIT")
        finally:
            db.close()
        faults.point("memo.committed")

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
