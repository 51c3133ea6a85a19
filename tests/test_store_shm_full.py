"""A store whose WAL -shm file cannot grow (a full disk, met as the store is opened) is said to be on a full disk."""

from __future__ import annotations

import sqlite3

from transbench.store.db import StoreFull, _translate


def _error(name: str) -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorname = name  # what sqlite3 sets from the extended result code
    return exc


def test_a_shm_file_that_cannot_grow_is_a_full_disk():
    # Seen on a full tmpfs: `merge --into` and a resume said "check that the file and its folder are writable".
    err = _translate("t.db", _error("SQLITE_IOERR_SHMSIZE"))
    assert isinstance(err, StoreFull) and "the disk holding store t.db is full" in str(err)


def test_other_io_errors_still_name_the_file_and_folder():
    err = _translate("t.db", _error("SQLITE_IOERR_WRITE"))
    assert not isinstance(err, StoreFull) and "check that the file and its folder are writable" in str(err)
