"""The SQLite store: one row per run, one row per finished cell, one transaction per cell.

WAL journaling keeps the file consistent when the process is killed at any moment: a cell is either
fully stored or absent.

A file is only written once it is known to be ours: its header is read first (SQLite's 100-byte file
header: the magic string, `application_id` at offset 68, `user_version` at 60), and an unmarked file's
tables are listed through an immutable read-only connection, so a foreign or damaged file is refused
before anything could add tables to it or switch its journal mode. Commands that only read (`runs`,
`report`, `compare`, `env --db`) open with `readonly=True`: the file must exist, and the connection is
`query_only`."""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import functools
import hashlib
import json
import math
import os
import re
import sqlite3
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from .. import boundary
from ..keys import CATALOGUE, KEYS, STATUSES
from ..errors import SpecError

# Marks a file as a transbench store (PRAGMA application_id: ASCII "tbnc"); stores written before the
# marker existed are recognized by their two tables and get it on their next write.
APP_ID = 0x74626E63
SCHEMA_VERSION = 1  # PRAGMA user_version: a newer one is refused rather than misread
# The kinds of run a store holds: the kind each command passes to open_run (scenarios/inference/run.py, training/
# spec.py, serve/run.py, micro/run.py). create_run takes no other, and a stored run of another kind is damage: a run
# whose kind was edited to 'bogus' was listed, compared and merged as if it were a kind of run. Each kind names the
# scenarios its cells are stored under (the cells' `scenario` property, and runner/sweep.py's max-batch answers and
# serve/run.py's max-rate answers): a cell of another, or a record whose scenario disagrees with its row's, is damage
# too, as an inference cell hand-moved into a training run was compared beside training cells without a word.
RUN_KINDS = {"inference": ("inference", "generation", "max-batch"), "training": ("training", "max-batch"),
             "serve": ("serve", "serve-max-rate"),
             "micro": ("micro-gemm", "micro-bandwidth", "micro-layer", "micro-breakdown", "micro-collectives")}
# The keys every stored record holds as text, equal to its row's columns of the same name (put_cell writes them):
# a record missing one, or holding another type, is damage named by run and cell, never a cell of no scenario.
RECORD_REQUIRED = ("scenario", "status")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    name TEXT UNIQUE NOT NULL,
    kind TEXT NOT NULL,
    created TEXT NOT NULL,
    spec TEXT NOT NULL,
    env TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS cells (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    key TEXT NOT NULL,
    scenario TEXT NOT NULL,
    status TEXT NOT NULL,
    record TEXT NOT NULL,
    cell TEXT NOT NULL,
    samples TEXT NOT NULL,
    info TEXT NOT NULL,
    warnings TEXT NOT NULL,
    created TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
);
"""
COLUMNS = {"runs": ["run_id", "name", "kind", "created", "spec", "env"],
           "cells": ["run_id", "key", "scenario", "status", "record", "cell", "samples", "info", "warnings",
                     "created"]}
# Spec settings that may differ within one run (a resumed run, the shards of one sweep): they decide where and
# how long cells run, not what they measure.
RESUMABLE = frozenset({"timeout", "gpus", "shard", "shard_count", "name", "node_rank", "rdzv_endpoint",
                       "rdzv_wait"})
RESUME = "free some space, then rerun the same command (add --resume if the run has no --name) to go on"
# How long a command waits for a lock of the store that another process holds (a writer for the write lock, held by
# an SQLite browser's open transaction or a merge into the store; any command for a store held with `PRAGMA
# locking_mode=EXCLUSIVE`), in all, before it is refused as locked; and the first part of that wait, after which the
# wait is said on stderr. SQLite's own busy wait (connect's timeout) printed nothing for the whole 60 s, and a Ctrl-C
# pressed during it took effect only when it ended: Python raises KeyboardInterrupt between statements, never inside
# one. The rest of the wait is taken in slices of LOCK_SLICE, so Ctrl-C ends it within one.
LOCK_WAIT = 60.0
LOCK_NOTICE = 1.0
LOCK_SLICE = 0.25


class StoreFull(SpecError):
    """The disk filled up while writing: what was stored before is whole, the run can be resumed."""


class RunExists(SpecError):
    """create_run found the name (or its id) taken: made by another process since it was looked up."""


# The run-name locks this process holds: (lock key, part) -> [descriptors, Stores holding it]. A lock is this
# process's, not one Store's: a second Store of the same file in the same process (a caller that did not close
# the first) takes it again instead of refusing itself.
_HELD: dict[tuple[str, str], list] = {}


def _release(held: tuple[str, str]) -> None:
    entry = _HELD.get(held)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _HELD[held]
        for fd in entry[0]:
            os.close(fd)


SIDE_FILES = ("-wal", "-shm", "-journal")


def side_file(path: str, suffix: str) -> Path:
    """A file SQLite keeps beside a store (`suffix`: one of SIDE_FILES, or "" for the store itself): beside the file a
    link leads to, named after it, as SQLite resolves links. Looked for beside the link, a killed sweep's -wal file was
    missed: its runs were left out of `runs`, `compare` and `report`, and `merge` dropped them, exit 0."""
    return Path(os.path.realpath(path) + suffix)


def _remove(path: str) -> None:
    # The file SQLite made, where the path is a link to no file yet: SQLite creates the link's target (and names its
    # side files after it), and unlinking the path itself removed the user's link and left the new store behind.
    for suffix in ("", *SIDE_FILES):
        side_file(path, suffix).unlink(missing_ok=True)


LOCK_ROOT_HELP = "the run-name locks are kept in $XDG_RUNTIME_DIR, else the temporary folder"


def _lock_folder_path() -> Path:
    """Where this user's run-name locks are on this host: the runtime folder (tmpfs, emptied at boot) where
    $XDG_RUNTIME_DIR is an absolute path, else the temporary folder. A relative one is ignored, as the XDG spec
    says: it named another folder from each working directory, so two writers of one store missed each other's
    locks."""
    import tempfile

    root = boundary.env_text("XDG_RUNTIME_DIR")
    if root is None or not os.path.isabs(root):
        root = tempfile.gettempdir()
    return Path(root) / f"transbench-locks-{os.getuid()}"


def _own_lock_folder(folder: Path) -> None:
    """Make the folder of run-name locks when missing, and refuse it (OSError) unless it is this user's own folder
    that no one else can write: in a shared temporary folder another user could make it first, or a link named so,
    and plant links in it that a lock or its note followed onto a file of this user's, which was overwritten."""
    import stat

    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "it is not a folder (a file or a link): remove it")
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(errno.EPERM, "it is not this user's own folder, or others may write in it: remove it")


def _identity(path: str) -> tuple[int, int] | None:
    """The file at `path` (a link's target) by device and inode, None where there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def new_run_ident(kind: str) -> tuple[str, str]:
    """(id, name) of a run the user did not name: a random id, and the kind, the time and the id's start as its name."""
    run_id = uuid.uuid4().hex[:12]
    return run_id, f"{kind}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{run_id[:4]}"


def _lock_key(path: str, name: str) -> str:
    """The store by its identity (one file however its path is spelled), and the run name."""
    st = os.stat(path)
    return hashlib.sha256(f"{st.st_dev}:{st.st_ino}\0{name}".encode()).hexdigest()[:32]


def _note_holder(path: Path, part: str) -> None:
    """Who holds the lock, for the message a second writer prints (best effort: the lock itself decides)."""
    try:  # O_NOFOLLOW: a link left in the folder is never followed onto another file
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"pid {os.getpid()}{f' (shard {part})' if part else ''}, since {_now()}")
    except OSError:
        pass


def _holder(path: Path) -> str:
    try:
        text = boundary.read_text(path, "lock note", limit=200)
    except SpecError:
        return ""
    return f" ({text})" if text.isprintable() else ""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _errname(exc: sqlite3.Error) -> str:
    """SQLITE_FULL, SQLITE_CORRUPT, ...: the code's name (Python 3.11+), else read from the message."""
    name = getattr(exc, "sqlite_errorname", None)
    if name:
        return name
    msg = str(exc)
    for needle, code in (("disk is full", "SQLITE_FULL"), ("malformed", "SQLITE_CORRUPT"),
                         ("not a database", "SQLITE_NOTADB"), ("readonly", "SQLITE_READONLY"),
                         ("unable to open", "SQLITE_CANTOPEN"), ("locked", "SQLITE_BUSY"),
                         ("I/O error", "SQLITE_IOERR")):
        if needle in msg:
            return code
    return ""


def _translate(path: str, exc: BaseException) -> SpecError | None:
    """The one line a storage failure reaches the user as, or None for a bug (raised as is)."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return StoreFull(f"the disk holding store {path} is full ({exc.strerror}): cells stored before are "
                         f"whole; {RESUME}")
    if not isinstance(exc, sqlite3.Error):
        return None
    undecodable = re.match(r"Could not decode to UTF-8 column '([^']{0,60})", str(exc))
    if undecodable:  # sqlite3 reading text of another encoding: its message quotes the text, control bytes and all
        return SpecError(f"store {path} is damaged: a value of column {undecodable.group(1)!r} is not UTF-8 text: "
                         "restore it from a copy, or give another --db")
    code = _errname(exc)
    if code.startswith("SQLITE_FULL"):
        return StoreFull(f"the disk holding store {path} is full ({exc}): cells stored before are whole; {RESUME}")
    if code == "SQLITE_IOERR_SHMSIZE":
        # WAL's -shm file could not grow: SQLite's own docs give a full disk as the cause, and a store on a full disk
        # met at open (`merge --into`, a resume) said "disk I/O error: check that the file and its folder are writable".
        return StoreFull(f"the disk holding store {path} is full ({exc}: its -shm file could not grow): cells stored "
                         f"before are whole; {RESUME}")
    if code.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return SpecError(f"store {path} is damaged ({exc}): restore it from a copy, or give another --db")
    if code.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_PERM")):
        return SpecError(f"cannot use store {path} ({exc}): check that the file and its folder are writable, "
                         "or give another --db")
    if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return SpecError(f"store {path} is locked by another process: wait for it to finish, or give another --db")
    return None


def _wait_for_lock(con: sqlite3.Connection, path: str, attempt):
    """attempt() (a statement on `con` that takes a lock of store `path` and changes nothing when refused), tried for
    LOCK_WAIT in all: after LOCK_NOTICE the wait is said on stderr in one line, and the rest is taken in LOCK_SLICE
    slices, so Ctrl-C ends it at once. Still locked at the end, SQLite's error is raised, said as "locked by another
    process" (_translate). `con`'s busy timeout is LOCK_WAIT again afterwards, for the statements that follow."""
    start = time.monotonic()
    told = False
    con.execute(f"PRAGMA busy_timeout={int(min(LOCK_NOTICE, LOCK_WAIT) * 1000)}")
    try:
        while True:
            try:
                return attempt()
            except sqlite3.OperationalError as exc:
                left = LOCK_WAIT - (time.monotonic() - start)
                if not _errname(exc).startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or left <= 0:
                    raise
            if not told:
                told = True
                sys.stderr.write(f"store {path} is locked by another process: waiting up to {LOCK_WAIT:g} s for it "
                                 "(Ctrl-C stops)\n")
                sys.stderr.flush()
            con.execute(f"PRAGMA busy_timeout={max(1, int(min(LOCK_SLICE, left) * 1000))}")
    finally:
        con.execute(f"PRAGMA busy_timeout={int(LOCK_WAIT * 1000)}")


def _guarded(method):
    """Storage failures of a Store method become one line for the user (SpecError or StoreFull)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            err = _translate(self.path, exc)
            if err is None:
                raise
            raise err from None

    return wrapper


_KIND_TEXT = {dict: "an object", list: "a list"}
_JSON_NAME = {type(None): "null", bool: "true or false", int: "a number", float: "a number", str: "a string",
              list: "a list", dict: "an object"}


def check_name_text(name: str | None) -> None:
    """A run name SQLite can store: refused before a command creates its store, and again on storing it."""
    if name is not None and not boundary.is_utf8(name):
        raise SpecError(f"run name {name!r} is not UTF-8 text (bytes the terminal could not decode): "
                        "use letters, digits, spaces and punctuation")


def _foreign(path: str) -> SpecError:
    return SpecError(f"{path} is a SQLite database of another application, not a transbench store: "
                     "it was left as it is; give a transbench store's path")


EMPTY_STORE = "store path is empty: give a file path, e.g. --db transbench.db"


def inspect(path: str) -> str:
    """What is at `path`, read without writing: 'missing', 'empty' (no tables: safe to start a store in)
    or 'ours'. A folder, a file that is not SQLite, another application's database or a store of a newer
    schema raises SpecError."""
    p = Path(path)
    if not path.strip():  # `--db ' '` made a store named ' ' (`--db ''` read as the folder '.')
        raise SpecError(EMPTY_STORE)
    if path == ":memory:" or path.startswith("file:"):
        # SQLite's names for a database in memory and for a URI: `merge --into :memory:` said it merged, and kept
        # nothing
        raise SpecError(f"store {path} is SQLite's name for a database that is not a plain file: give a file path, "
                        "e.g. --db transbench.db")
    if path.endswith(("/", os.sep)):  # SQLite opened `x.db/` as x.db, and a new x.db was made beside the refusal
        raise SpecError(f"store {path} ends in a folder separator: give a file path, e.g. --db "
                        f"{path.rstrip('/' + os.sep) or 'transbench.db'}")
    dots = next((d for d in (".", "..") for sep in {"/", os.sep} if path.endswith(sep + d)), None)
    if dots:
        # pathlib reads `s.db/.` as s.db, the OS as no file: readers read s.db, a writer was told that s.db is
        # read-only, and `merge --into m.db/.` that the run-name lock's folder was not one
        named = path[:-len(dots) - 1]
        raise SpecError(f"store {path} ends in '{dots}', which names a folder: give a file path, e.g. --db "
                        f"{named if os.path.isfile(named) else os.path.normpath(os.path.join(path, 'transbench.db'))}")
    side = next((suffix for suffix in SIDE_FILES if path.endswith(suffix)), None)
    if side:  # SQLite takes such a file for the side file of the store named without it, and deletes or rewrites it
        raise SpecError(f"store {path} is named as SQLite names the side files of a store ({side}): SQLite would "
                        f"delete or rewrite it when {path[:-len(side)]} is opened; give another name")
    try:
        folder, exists, regular = p.is_dir(), p.exists(), p.is_file()
    except OSError as exc:  # pathlib before Python 3.13 raises for a name too long (ENAMETOOLONG) or a folder that
        # cannot be searched (EACCES): `--db` of a 10,000-character name was a traceback in every command
        raise SpecError(f"cannot use store {path} ({exc.strerror}): check the path, or give another --db") from None
    try:
        os.stat(side_file(path, "-journal"))  # the longest of the names SQLite keeps beside a store (also -wal, -shm)
    except OSError as exc:  # a name of 248 to 255 bytes: the store's own fits, its -wal file's did not (a traceback)
        if exc.errno == errno.ENAMETOOLONG:
            raise SpecError(f"cannot use store {path}: SQLite keeps {p.name}-wal and -journal beside it, and that "
                            "name is too long for the file system: give a shorter name, or another --db") from None
    if folder:
        raise SpecError(f"store {path} is a folder: give a file path, e.g. --db {p / 'transbench.db'}")
    loop = boundary.link_nowhere(p)
    if loop and "loop" in loop:  # a link to a missing file is a store still to make, at the link's target
        raise SpecError(f"store {path} {loop}: give another --db")
    _check_side_files(path)
    if not exists:
        _refuse_orphan_wal(path, f"no store at {path}")
        return "missing"
    if not regular:
        # A FIFO blocked the read below for ever; /dev/null read as an empty file, and a writer then made
        # /dev/null-journal beside it.
        raise SpecError(f"store {path} is not a regular file (a device, a pipe, a socket): it was left as it is; "
                        "give a file path")
    try:
        with open(p, "rb") as f:
            head = f.read(100)
    except OSError as exc:
        raise SpecError(f"cannot read store {path} ({exc.strerror}): check its permissions, or give another "
                        "--db") from None
    if not head:
        _refuse_orphan_wal(path, f"store {path} is an empty file")
        return "empty"
    if len(head) < 100 or not head.startswith(b"SQLite format 3\x00"):
        raise SpecError(f"{path} is not a SQLite database, so not a transbench store: it was left as it is; "
                        "give a transbench store's path")
    if _unfinished_write(path):
        raise SpecError(f"store {path} has an unfinished write in {side_file(path, '-journal').name} beside it (a "
                        "program that wrote it in SQLite's rollback-journal mode was stopped part-way): what the file "
                        "holds may be half written; it was left as it is: open the store once with sqlite3, which "
                        "rolls the write back, or restore it from a copy")
    app_id = int.from_bytes(head[68:72], "big", signed=True)
    version = int.from_bytes(head[60:64], "big", signed=True)

    def refuse_newer(version: int) -> None:
        if version > SCHEMA_VERSION:
            raise SpecError(f"store {path} has schema version {version}, newer than this transbench knows "
                            f"({SCHEMA_VERSION}): upgrade transbench to read it")

    if app_id == APP_ID:
        refuse_newer(version)
        # The marker alone does not make the tables: a writer killed between marking a new file and creating
        # its tables leaves a marked file with none (safe to start in), and a marked file whose tables are
        # not ours would fail on the first query with a traceback, after a writer had switched its journal.
        tables, version = _tables(path, ours=True)
        # the version as SQLite reads it, through a killed writer's -wal file: a newer transbench's version there
        # (not yet in the main file's header) was read, and written to, by this schema
        refuse_newer(version)
        _no_triggers(path, tables)
        if not tables:
            return "empty"
        if not _our_tables(tables):
            raise SpecError(f"store {path} is damaged (its tables runs and cells are missing or not laid out as a "
                            "transbench store's: other columns, indexes or constraints): it was left as it is; "
                            "restore it from a copy, or give another --db")
        return "ours"
    if app_id != 0:
        raise _foreign(path)
    tables, wal_version = _tables(path)
    if tables and not _our_tables(tables):
        raise _foreign(path)
    _no_triggers(path, tables)
    # Our tables (a store from before the marker) or none, with the version of a newer schema: only marked files were
    # checked for it, so `runs` read such a file by today's schema and a writer stamped it with this one's version.
    refuse_newer(max(version, wal_version))
    return "ours" if tables else "empty"


# The first bytes of a rollback journal that holds a write not yet committed or rolled back (SQLite's file format,
# "the rollback journal"); a committed one is deleted, truncated or has its header zeroed.
JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")


def _unfinished_write(path: str) -> bool:
    """A hot journal beside the store: a -journal file that holds a write no process is finishing (a program writing
    the store in SQLite's rollback-journal mode, stopped part-way). Readers open a store immutable (no lock; _reader)
    and read its pages as they are: such a store's half-written rows were listed, compared and merged as stored, exit
    0. A journal a live writer holds (a new store's first transaction runs before WAL is on: shards started at once
    on one store) ends with its commit: the read lock taken here waits for it, as for any lock (_wait_for_lock). Side
    files that are not regular files are refused before (_check_side_files), so the read of the journal cannot
    block."""
    try:
        with open(side_file(path, "-journal"), "rb") as f:
            if f.read(len(JOURNAL_MAGIC)) != JOURNAL_MAGIC:
                return False
    except OSError:
        return False
    con = None
    try:
        con = sqlite3.connect(f"{Path(path).absolute().as_uri()}?mode=ro", uri=True)
        # SQLite rolls a hot journal back before the first read, which a read-only connection may not do
        _wait_for_lock(con, path, lambda: con.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall())
        return False
    except sqlite3.Error as exc:
        if _errname(exc).startswith("SQLITE_READONLY"):
            return True
        raise _translate(path, exc) or exc from None
    finally:
        if con is not None:
            con.close()


def _refuse_orphan_wal(path: str, what: str) -> None:
    """A -wal file with cells beside a store that is gone or empty (moved, removed or emptied without it: a killed
    sweep's newest cells): a writer made a new store at the path, and SQLite deleted that -wal file, their only copy."""
    wal = side_file(path, "-wal")
    if wal.is_file() and wal.stat().st_size:
        raise SpecError(f"{what}, but {wal.name} beside it holds the newest writes of a store of that name (moved, "
                        f"removed or emptied without it): it was left as it is; put that store back beside it, or move "
                        f"{wal.name} away")


def _check_side_files(path: str) -> None:
    """SQLite's side files of a store are regular files or absent. A folder, a link, a pipe or a device of that name
    failed inside SQLite, said as "store S is damaged ...: restore it from a copy" or "check that the file and its
    folder are writable", where the store was whole and writable."""
    import stat

    for suffix in SIDE_FILES:
        side = side_file(path, suffix)
        try:
            mode = os.lstat(side).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            raise SpecError(f"store {path} has {side.name} beside it, which is not a regular file (a folder, a link, "
                            "a pipe or a device): SQLite keeps a store's unfinished writes and its shared index in "
                            "files of that name, and cannot use it; the store was left as it is: move that away, "
                            "or give another --db")


# _tables' entry for the file's triggers, where it has any. A transbench store has none: a trigger's RAISE turned a
# cell's insert into a traceback after the run had been opened (`run` left a run of no cells behind).
TRIGGERS = "(triggers)"


def _our_tables(tables: dict[str, tuple]) -> bool:
    """Our two tables laid out exactly as SCHEMA makes them. Their column names alone let through a table WITHOUT
    ROWID (every read ordered by rowid was a traceback), a hidden generated column (`SELECT r.*` read it as the
    count of cells), and an index or constraint of another's (a unique index on cells(status) turned a merge's
    INSERT OR REPLACE into deletions of stored cells, exit 0)."""
    expected = _expected_layout()
    return all(tables.get(t) == expected[t] for t in COLUMNS)


def _layout(con: sqlite3.Connection, table: str) -> tuple:
    """What a table is, beyond its data: the CREATE statement SQLite keeps for it (SCHEMA's has not changed since
    the first store: a CHECK, WITHOUT ROWID, a virtual table or an added column all show there), its columns as
    SQLite reads them, and its indexes (unique, origin, partial, columns), another's CREATE INDEX among them."""
    sql = con.execute("SELECT sql FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone()
    columns = tuple(con.execute('SELECT name, type, "notnull", pk, hidden FROM pragma_table_xinfo(?)', (table,)))
    indexes = []
    for name, unique, origin, partial in con.execute(
            'SELECT name, "unique", origin, partial FROM pragma_index_list(?)', (table,)).fetchall():
        keys = tuple(r[0] for r in con.execute("SELECT name FROM pragma_index_xinfo(?) WHERE key", (name,)))
        indexes.append((unique, origin, partial, keys))
    return sql, columns, tuple(sorted(indexes, key=repr))


@functools.cache
def _expected_layout() -> dict[str, tuple]:
    con = sqlite3.connect(":memory:")
    try:
        con.executescript(SCHEMA)
        return {t: _layout(con, t) for t in COLUMNS}
    finally:
        con.close()


def _no_triggers(path: str, tables: dict[str, list[str]]) -> None:
    if TRIGGERS in tables:
        names = ", ".join(repr(t)[:60] for t in tables[TRIGGERS][:3])  # repr: a name may hold a line break
        raise SpecError(f"store {path} holds triggers ({names}), which no transbench store has: it was left as it "
                        "is; restore it from a copy, or give another --db")


def _tables(path: str, ours: bool = False) -> tuple[dict[str, tuple], int]:
    """({table or view: its _layout (() for a table not ours, ("view",) for a view)}, user_version) of a file (`ours`:
    one that carries our marker), read without writing a byte: immutable (no lock, no -shm file) unless a -wal file
    beside it may hold the newest schema and version, which only a plain read-only connection reads."""
    wal = side_file(path, "-wal")
    flags = "mode=ro" if wal.exists() and wal.stat().st_size else "mode=ro&immutable=1"
    try:
        con = sqlite3.connect(f"{Path(path).absolute().as_uri()}?{flags}", uri=True)
        try:
            # Views too, as objects that are not our tables whatever their names: a file of views alone (another
            # application's) read as empty, safe to start a store in, and a writer marked it, then failed on CREATE
            # TABLE beside a view named runs: a traceback, the file changed.
            # The first read takes the file's read lock: a process that holds the store exclusively (`PRAGMA
            # locking_mode=EXCLUSIVE`) is waited for as a writer waits for the write lock, not sqlite3's silent 5 s.
            rows = _wait_for_lock(con, path, lambda: con.execute(
                "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')").fetchall())
            out = {n: (_layout(con, n) if n in COLUMNS else ()) if kind == "table" else ("view",) for n, kind in rows}
            triggers = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='trigger'")]
            (version,) = con.execute("PRAGMA user_version").fetchone()
            return ({**out, TRIGGERS: triggers} if triggers else out), version
        finally:
            con.close()
    except sqlite3.Error as exc:
        if flags == "mode=ro" and not side_file(path, "-shm").exists() and not os.access(wal.parent, os.W_OK):
            # SQLite reads a -wal file only through a -shm file beside it, which this folder takes no new file for
            # (a read-only mount, a shared folder): a killed sweep's store there was called damaged, "restore it from
            # a copy", where store and -wal are whole.
            raise SpecError(f"store {path} has cells in its -wal file (a sweep that did not end) and SQLite needs "
                            f"to make {Path(path).name}-shm beside it to read them, which its folder does not allow "
                            "(read-only): copy the store and its -wal file to a folder you can write in, and give "
                            "that --db") from None
        # Neither is damage, and "restore it from a copy" would have the user throw away a whole store: a process
        # that holds it exclusively (`PRAGMA locking_mode=EXCLUSIVE`, with writes in its -wal file), and a -wal or
        # -shm file this user cannot read (SQLite said "unable to open database file").
        if _errname(exc).startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            raise _translate(path, exc) from None
        unreadable = next((s for s in (wal, side_file(path, "-shm")) if s.exists() and not os.access(s, os.R_OK)),
                          None)
        if unreadable is not None:
            why = ("SQLite keeps the store's newest writes in it" if unreadable == wal else
                   "SQLite reads the store's -wal file through it")
            raise SpecError(f"cannot read {unreadable.name} beside store {path} (no permission): {why}; make it "
                            "readable, or give another --db") from None
        if ours:  # a store of ours, damaged: said as _translate says it
            raise SpecError(f"store {path} is damaged ({exc}): it was left as it is; restore it from a copy, "
                            "or give another --db") from None
        raise SpecError(f"{path} is not a readable SQLite database ({exc}): it was left as it is; "
                        "give a transbench store's path") from None


def _writable(path: str, kind: str) -> None:
    """A writer needs the file (when there) and its folder (for the new file, and WAL's -wal and -shm
    files) writable. os.access also answers EROFS for a read-only file system."""
    folder = side_file(path, "").parent  # a link's target's folder: SQLite makes the store and its side files there
    if not folder.is_dir():
        # `--db notes.txt/x.db` was told to `mkdir -p notes.txt`, which the file there refuses
        there = boundary.file_above(folder)
        if there is not None:
            raise SpecError(f"store {path} is inside {there}, which is a file, not a folder: give another --db")
        raise SpecError(f"folder {folder} of store {path} does not exist: create it (mkdir -p {folder}) "
                        "or give another --db")
    if not os.access(folder, os.W_OK):
        raise SpecError(f"folder {folder} of store {path} is not writable (no permission, or a read-only "
                        "file system): give another --db")
    if kind != "missing" and not os.access(path, os.W_OK):
        raise SpecError(f"store {path} is read-only: make it writable, or give another --db")


def _reader(path: str) -> tuple[str, bool]:
    """(database, uri) of a reader's connection: read-only, and immutable (no lock, no side file) unless a -wal
    file beside it holds cells not yet in the main file. A plain connection would fail on WAL's -shm file where
    the file or its folder cannot be written ("attempt to write a readonly database"), and where they can, the
    last one to close checkpoints the -wal file of a killed sweep into the store and deletes it: a reader (a
    refused `compare`, `runs`) rewrote the store's bytes."""
    wal = side_file(path, "-wal")
    flags = "mode=ro" if wal.exists() and wal.stat().st_size else "mode=ro&immutable=1"
    return f"{Path(path).absolute().as_uri()}?{flags}", True


class Store:
    def __init__(self, path: str | Path = "transbench.db", *, readonly: bool = False):
        """Open the store at `path`. A writer (the default) creates it when missing; `readonly=True` is for
        commands that only read: the file must exist and nothing is written to it."""
        self.path = str(path)
        kind = inspect(self.path)
        if readonly and kind == "missing":
            why = boundary.link_nowhere(self.path)
            raise SpecError(f"no store at {self.path}{f' (it {why})' if why else ''}: check the path (`transbench run "
                            f"--db {self.path}` creates a store)")
        if readonly and kind == "empty":
            raise SpecError(f"{self.path} is an empty database with no runs: give the --db of a store with "
                            "runs, or fill it with `transbench run`")
        if not readonly:
            _writable(self.path, kind)
        # A zero-length file (made with `touch`, a name kept ready) that a writer marks as a store and then stores no
        # run in is made zero-length again, with its times (_blank_again): `run --resume` refused "nothing to resume"
        # and left the user's empty file a 24 KiB store.
        blank = not readonly and kind == "empty" and not os.path.getsize(self.path)
        self._blank = os.stat(self.path) if blank else None
        try:
            # lanes share the connection under a lock
            database, uri = _reader(self.path) if readonly else (self.path, False)
            self.conn = sqlite3.connect(database, timeout=LOCK_WAIT, check_same_thread=False, uri=uri)
        except sqlite3.Error as exc:
            raise _translate(self.path, exc) or exc from None
        try:
            if readonly:
                self.conn.execute("PRAGMA query_only=ON")
            else:
                self._prepare(kind)
            if kind != "missing":
                self._check_orphans()
        except BaseException:
            self.conn.close()
            if kind == "missing":  # a store that could not be started leaves no file behind
                _remove(self.path)
            self._blank_again()
            raise
        self.new = kind == "missing"
        self._where = os.path.abspath(self.path)  # a library caller may change its working folder meanwhile
        self._identity = _identity(self._where)

    def _check_in_place(self) -> None:
        """A writer's store is still the file it opened. One removed, moved or replaced during a run went on being
        written through the open connection, to a file no path reached: the run printed `stored in S as run R`, exit
        0, and every cell was lost."""
        if _identity(self._where) != self._identity:
            raise SpecError(f"store {self.path} was removed, moved or replaced by another file while this command "
                            "wrote to it: the cells it stored went with the file it had opened, and nothing more is "
                            "stored; put that file back at this path and rerun the same command to go on, or "
                            "rerun it to measure again")

    @_guarded
    def _check_orphans(self) -> None:
        """Cells of a run the store does not list are damage, said where every command opens it: merge alone refused
        them; `runs --out` exported the other cells (exit 0) and `report` called them unmatched."""
        orphan = self.conn.execute(
            "SELECT run_id FROM cells WHERE run_id NOT IN (SELECT run_id FROM runs) LIMIT 1").fetchone()
        if orphan is not None:
            raise SpecError(f"store {self.path} is damaged: it holds cells of run id {str(orphan[0])[:40]!r}, which it "
                            "does not list: restore it from a copy, or give another --db")

    def _unused(self) -> bool:
        """No run is stored (a command was refused before its first run)."""
        try:
            return not self.conn.execute("SELECT 1 FROM runs LIMIT 1").fetchone()
        except sqlite3.Error:  # closed already, or unreadable: the file is left as it is
            return False

    def _remove_if_unused(self) -> None:
        """A store this Store created and wrote no run to is removed: a command refused before its first run (the
        run-name lock's folder cannot be made) left a new, empty store behind. One that was a zero-length file is
        made one again."""
        if (getattr(self, "new", False) or self._blank is not None) and self._unused():
            self.conn.close()
            if self.new:
                _remove(self.path)
            self._blank_again()

    def _blank_again(self) -> None:
        """The zero-length file this writer found (self._blank: its stat) as it was: zero bytes, its times. Called once
        the connection is closed, which removes SQLite's side files of the store."""
        before, self._blank = self._blank, None
        if before is None:
            return
        target = side_file(self.path, "")
        try:
            os.truncate(target, 0)
            os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
        except OSError:  # removed or replaced meanwhile: nothing of it to restore
            pass

    @_guarded
    def _prepare(self, kind: str) -> None:
        # The marker goes in before WAL is switched on, so it is in the main file's header at once
        # (a header change made in WAL mode sits in the -wal file until a checkpoint).
        if kind != "ours" or self.conn.execute("PRAGMA application_id").fetchone()[0] != APP_ID:
            with self._writing():  # statement by statement: executescript would commit the marker alone first
                self.conn.execute(f"PRAGMA application_id={APP_ID}")
                self.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        self.conn.execute(statement)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")

    @contextlib.contextmanager
    def _writing(self):
        """One write transaction (committed whole, or rolled back), begun by taking the store's write lock: every write
        of a Store goes through here, so a lock another process holds is met here, and waited for aloud
        (_wait_for_lock). BEGIN IMMEDIATE takes it before any statement, so a refused or interrupted writer has
        changed nothing, and retrying it is safe (a deferred transaction meets the lock at its first INSERT, where a
        retry may find its snapshot stale)."""
        with self.conn:
            _wait_for_lock(self.conn, self.path, lambda: self.conn.execute("BEGIN IMMEDIATE"))
            yield

    def close(self) -> None:
        blank = getattr(self, "_blank", None) is not None and self._unused()
        for held in getattr(self, "_locks", {}).values():  # the run names this store held for this process
            _release(held)
        self._locks = {}
        self.conn.close()
        if blank:
            self._blank_again()

    # --- who writes a run -----------------------------------------------------------------------
    def claim(self, name: str, part: str = "") -> None:
        """Hold run `name` (`part`: a shard, 'I/N', or '' for the whole grid) for this process until close(). Two
        processes on one name had both measured, and the later one's INSERT OR REPLACE dropped the other's cell
        without a word; now the second refuses in one line, before it measures anything.

        The lock is the kernel's (flock) on a file named by the store's identity (device and inode) and the run
        name, in this host's runtime folder: it ends with its process however that ends (SIGKILL, a power cut
        included), so no lock outlives its writer, and the store's own bytes are not touched, so a command refused
        after taking it leaves the store byte-identical. A whole-grid writer holds the name's lock exclusively; a
        shard holds it shared and its shard's lock exclusively, so shards of one sweep write side by side."""
        import fcntl

        check_name_text(name)
        self._locks = getattr(self, "_locks", {})
        if (name, part) in self._locks:
            return
        fds, folder = [], "the runtime folder"
        try:
            folder = _lock_folder_path()
            _own_lock_folder(folder)
            key = _lock_key(self.path, name)
            held = _HELD.get((key, part))
            if held is not None:  # this process holds it already (an earlier Store of this file, not closed)
                held[1] += 1
                self._locks[(name, part)] = (key, part)
                return
            shard = part.split("/")[0] if part else ""
            wanted = [(folder / f"{key}.lock", fcntl.LOCK_SH if shard else fcntl.LOCK_EX)]
            if shard:
                wanted.append((folder / f"{key}.{shard}.lock", fcntl.LOCK_EX))
            for path, mode in wanted:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
                fds.append(fd)
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _holder(folder / f"{key}.who")
                    raise SpecError(f"run '{name}'{f' (shard {part})' if part else ''} is being written to store "
                                    f"{self.path} by another process{holder}: wait for it to end, or choose "
                                    "another --name") from None
        except (OSError, boundary.BadInput) as exc:  # BadInput: an XDG_RUNTIME_DIR of thousands of characters
            for fd in fds:
                os.close(fd)
            self._remove_if_unused()
            raise SpecError(f"cannot lock run '{name}' of store {self.path} ({getattr(exc, 'strerror', None) or exc}) "
                            f"in {folder}: "
                            f"check that folder's permissions ({LOCK_ROOT_HELP}), or set XDG_RUNTIME_DIR to a "
                            "folder of your own") from None
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        _HELD[(key, part)] = [fds, 1]
        self._locks[(name, part)] = (key, part)
        _note_holder(folder / f"{key}.who", part)

    # --- runs -----------------------------------------------------------------------------------
    @_guarded
    def create_run(self, name: str | None, kind: str, spec: dict, env: dict,
                   run_id: str | None = None) -> tuple[str, str]:
        """A new run: `name` and `run_id` as given (an unnamed run's, from new_run_ident), a named run's id derived
        from its name (shards of one sweep on several hosts share it and `merge` joins their cells), or for neither
        a new unnamed run's."""
        check_name_text(name)
        if kind not in RUN_KINDS:  # a caller's bug: what is written must read back (_run refuses other kinds)
            raise ValueError(f"run kind {kind!r} is not one of {', '.join(RUN_KINDS)} (store.db.RUN_KINDS)")
        if not name:
            run_id, name = new_run_ident(kind)
        elif run_id is None:
            run_id = hashlib.sha256(name.encode()).hexdigest()[:12]
        try:
            with self._writing():
                self.conn.execute("INSERT INTO runs VALUES (?,?,?,?,?,?)",
                                  (run_id, name, kind, _now(), json.dumps(spec), json.dumps(env)))
        except sqlite3.IntegrityError:
            # Another process writing this store (a second shard given the same --name) made the run between
            # the caller's look-up and this insert: a traceback before; now the caller can resume that run.
            raise RunExists(f"run '{name}' cannot be added to store {self.path}: its name or its id ({run_id}) "
                            "is another run's: choose another --name") from None
        return run_id, name

    @_guarded
    def find_run(self, ref: str) -> dict | None:
        """A run by name, by id, or 'last' for the newest. A name wins over another run's id: a run may be
        named like one (12 hex digits), and must not then stand for that other run."""
        if not boundary.is_utf8(ref):
            return None  # no stored name holds text that is not UTF-8 (a shell's undecodable bytes)
        if ref == "last":
            # A run whose date is not text (NULL in a damaged page) sorts below every date: 'last' passed over it to
            # an older run, reported as the newest, exit 0, where `runs` refused the store as damaged. Which run is
            # the newest is not known then: that run is refused as damaged (_run) here too.
            row = self.conn.execute("SELECT * FROM runs WHERE typeof(created) != 'text' LIMIT 1").fetchone()
            row = row or self.conn.execute("SELECT * FROM runs ORDER BY created DESC, rowid DESC LIMIT 1").fetchone()
        else:
            row = self.conn.execute("SELECT * FROM runs WHERE run_id=? OR name=? ORDER BY name=? DESC LIMIT 1",
                                    (ref, ref, ref)).fetchone()
        return None if row is None else self._run(row)

    @_guarded
    def run_by_id(self, run_id: str) -> dict | None:
        """The run of exactly this id: what a command reads back after it wrote or looked up a run. find_run would
        take another run whose name is this id (`run --name ca978112ca1b`, then `run --name a`, whose id that is),
        and a run printed, exported, compared or reported that other run's cells."""
        row = self.conn.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return None if row is None else self._run(row)

    @_guarded
    def run_named(self, name: str) -> dict | None:
        """The run of exactly this name (never 'last', never an id): the run a --name resumes."""
        if not boundary.is_utf8(name):
            return None
        row = self.conn.execute("SELECT * FROM runs WHERE name=?", (name,)).fetchone()
        return None if row is None else self._run(row)

    @_guarded
    def runs(self) -> list[dict]:
        rows = self.conn.execute(
            "SELECT r.*, (SELECT COUNT(*) FROM cells c WHERE c.run_id=r.run_id) FROM runs r ORDER BY created, rowid"
        ).fetchall()
        return [{**self._run(r[:6]), "cells": r[6]} for r in rows]

    def _run(self, row) -> dict:
        where = f"run '{_cut(str(row[1]))}'"
        if not all(isinstance(v, str) for v in row[:4]):
            raise SpecError(f"store {self.path} is damaged: run {_cut(repr(row[1]))} has an id, name, kind or date "
                            "that is not text: restore it from a copy, or give another --db")
        if row[2] not in RUN_KINDS:
            self._damaged("kind", where, f"{_cut(repr(row[2]))}, not one of {', '.join(RUN_KINDS)}")
        if not _is_date(row[3]):
            self._damaged("date", where, f"{_cut(repr(row[3]))}, not an ISO 8601 date and time")
        return {"run_id": row[0], "name": row[1], "kind": row[2], "created": row[3],
                "spec": self._json(row[4], dict, "spec", where), "env": self._json(row[5], dict, "env", where)}

    def _damaged(self, column: str, where: str, why: str) -> NoReturn:
        """The one line every damaged row of a run or a cell is refused with, naming the store, the row and why."""
        raise SpecError(f"store {self.path} is damaged: the {column} of {where} is {why}: restore it from a copy, or "
                        "give another --db")

    def _json(self, text, kind: type, column: str, where: str):
        """A stored JSON column, checked through the input boundary (nesting bounded) and against what the column
        declares: a row edited by hand or written half by another program is one line naming the store, the run
        and the cell, not a traceback in whatever command reads it next (or a copy in a merge)."""
        why = None
        if not isinstance(text, str):
            why = f"{type(text).__name__}, not JSON text"
        else:
            try:
                value = boundary.loads_json(text, "row", depth=boundary.DEPTH, fix="")
            except SpecError as exc:
                why = f"not JSON ({str(exc).removeprefix('row: ')})"
            else:
                if not isinstance(value, kind):
                    why = f"{_JSON_NAME.get(type(value), type(value).__name__)}, not {_KIND_TEXT[kind]}"
                else:
                    why = _column_problem(column, value)
        if why is None:
            return value
        self._damaged(column, where, why)

    def _samples(self, text, where: str):
        """A stored samples column as one numpy float64 array, checked as _json checks it. A list of floats as
        put_cell writes it is read straight into the array (decode_samples); anything else goes through _json,
        which refuses it in the same line as before or reads it."""
        import numpy as np

        x = decode_samples(text) if isinstance(text, str) else None
        if x is None:
            return np.asarray(self._json(text, list, "samples", where), dtype=np.float64)
        why = _column_problem("samples", x)
        if why is not None:
            self._damaged("samples", where, why)
        return x

    # --- cells ----------------------------------------------------------------------------------
    @_guarded
    def put_cell(self, run_id: str, key: str, scenario: str, status: str, record: dict, *, cell: dict,
                 samples: list | None = None, info: dict | None = None, warnings: list | None = None) -> None:
        """Store a cell; its record names the row's scenario and status where it does not (RECORD_REQUIRED)."""
        self._check_in_place()
        with self._writing():  # one transaction: the cell is stored whole or not at all
            self.conn.execute(
                "INSERT OR REPLACE INTO cells VALUES (?,?,?,?,?,?,?,?,?,?)",
                (run_id, key, scenario, status, json.dumps(finite_json({"scenario": scenario, "status": status,
                                                                         **record}), default=str), json.dumps(cell),
                 json.dumps(samples or []), json.dumps(finite_json(info or {}), default=str),
                 json.dumps(warnings or []), _now()),
            )

    @_guarded
    def finished_keys(self, run_id: str) -> set[str]:
        """Keys of the cells a resume does not measure again: every stored cell but an `error` one. An error is a
        crash (a worker killed by the OS, a CUDA fault, a full disk in a library) that need not happen again; a
        resume that skipped it left the run with a hole that only a new --name could fill. `wrong`,
        `unsupported`, `oom` and `timeout` are answers about the cell and stay."""
        return {r[0] for r in self.conn.execute("SELECT key FROM cells WHERE run_id=? AND status != 'error'",
                                                (run_id,))}

    @_guarded
    def cells(self, run_id: str, cell_type=None) -> list[dict]:
        """The run's cells, every column checked; with `cell_type` (a cells.SweepCell class: the reader builds its
        cells from the `cell` column) that column's fields against the types the class declares."""
        run = self.conn.execute("SELECT name, kind FROM runs WHERE run_id=?", (run_id,)).fetchone()
        # Row by row, not fetchall: each row's samples text is let go once decoded, not every row's held at once. The
        # rowids are looked up first and the rows read in their order: `WHERE run_id=? ORDER BY rowid` sorted whole
        # rows in a temporary b-tree, a copy of every samples text (305 MB of memory to read one cell of 6,000,000
        # samples, 126 MB so).
        rows = self.conn.execute(
            "SELECT key, scenario, status, record, cell, samples, info, warnings, created FROM cells "
            "WHERE rowid IN (SELECT rowid FROM cells WHERE run_id=?) ORDER BY rowid", (run_id,))
        run_name = _cut(run[0] if run and isinstance(run[0], str) else str(run_id))
        scenarios = RUN_KINDS.get(run[1]) if run and isinstance(run[1], str) else None
        out = []
        for r in rows:
            if not all(isinstance(v, str) for v in (r[0], r[1], r[2])):
                raise SpecError(f"store {self.path} is damaged: a cell of run '{run_name}' has a key, scenario or "
                                "status that is not text: restore it from a copy, or give another --db")
            where = f"cell '{_key_text(r[0])}' of run '{run_name}'"  # as docs/input-boundary.md quotes it
            if r[2] not in STATUSES:  # compare took any other status for a failure: `fixed`, "A was bogus"
                self._damaged("status", where, f"{_cut(repr(r[2]))}, not one of {', '.join(STATUSES)}")
            if r[0][:1] in ("{", "[") and not isinstance(_parsed(r[0]), dict if r[0][0] == "{" else list):
                # The form sweep.store_result writes (cell.key(): the settings as a JSON object), cut short or edited:
                # compare took it for one setting of that text. A key in no JSON form at all is left as it is:
                # Store.put_cell takes any text as a key (compare.settings reads it as one setting).
                self._damaged("key", where, "JSON cut short or edited, not the cell's settings")
            if not _is_date(r[8]):
                self._damaged("date", where, f"{_cut(repr(r[8]))}, not an ISO 8601 date and time")
            record, cell, info, warnings = (self._json(text, kind, name, where) for text, kind, name in zip(
                (r[3], r[4], r[6], r[7]), (dict, dict, dict, list), ("record", "cell", "info", "warnings")))
            samples = self._samples(r[5], where)
            problem = cell_type.field_problem(cell) if cell_type is not None else None
            if problem:
                self._damaged("cell", where, problem)
            if scenarios is not None and r[1] not in scenarios:
                self._damaged("scenario", where, f"{_cut(repr(r[1]))}, not a scenario of its run's kind, {run[1]} "
                              f"({', '.join(scenarios)})")
            for name, row_value in zip(RECORD_REQUIRED, (r[1], r[2])):
                if name not in record:
                    # A record without its scenario read as a cell of no scenario: `compare` then matched none of
                    # the other run's cells and said the runs "share no cell", hiding the damage.
                    self._damaged("record", where, f"a record without its {name} key (its row's is "
                                  f"{_cut(repr(row_value))})")
                if not isinstance(record[name], str):
                    self._damaged("record", where, f"a record whose {name} is "
                                  f"{_JSON_NAME.get(type(record[name]), type(record[name]).__name__)}, not text")
                if record[name] != row_value:
                    self._damaged("record", where, f"a record of {name} {repr(record[name])[:80]}, not its row's "
                                  f"{_cut(repr(row_value))}")
            out.append({"key": r[0], "scenario": r[1], "status": r[2], "record": record, "cell": cell,
                        "samples": samples, "info": info, "warnings": warnings, "created": r[8]})
        return out

    @_guarded
    def rows(self, table: str) -> list[tuple]:
        """Every row of `table` ('runs' or 'cells'), columns in schema order."""
        return self.conn.execute(f"SELECT {', '.join(COLUMNS[table])} FROM {table}").fetchall()

    # --- merge ----------------------------------------------------------------------------------
    @_guarded
    def merge_from(self, *paths: str) -> Merged:
        """Copy runs and cells from other stores (opened read-only: a damaged or foreign one is refused
        before anything is written). A cell already here (same run, same key) is kept once: the first copy
        (this store's, then the sources' in order), except that an `error` copy gives way to a later one that
        ran, as --resume measures error cells again. Copies that differ are named in `differing` (a silent
        choice had hidden that one of two results was dropped). One transaction for all of them: a refusal or
        a failure leaves this store as it was (merging the sources one by one had written the first before
        the second was refused)."""
        others = [Store(p, readonly=True) for p in paths]
        out = Merged()
        try:
            # Each run merged in is held as a writer holds it (claim), before anything is read back: merged into a run
            # that a sweep was writing to this store, its cells were counted as merged, then replaced by the sweep's
            # INSERT OR REPLACE of the same keys without a word.
            for other in others:
                for row in other.rows("runs"):
                    if isinstance(row[1], str) and row[1].strip() == "last":
                        # `run` refuses the name (spec.check_name): merged, `compare last` read the newest run instead
                        raise SpecError(f"store {other.path} has a run named 'last', which stands for the latest run "
                                        "in every command: nothing was merged; rename that run in its store first")
                    if isinstance(row[1], str):  # a name that is not text is damage, refused by the check below
                        self.claim(row[1])
            # This store is read back too: merging into a damaged one spread nothing, but wrote beside the damage
            # without a word.
            check_mergeable([self, *others], {})
            names = {r["run_id"]: r["name"] for r in self.runs()}
            with self._writing():
                for other in others:
                    for row in other.rows("runs"):
                        added = self.conn.execute("INSERT OR IGNORE INTO runs VALUES (?,?,?,?,?,?)", row).rowcount
                        if not added:
                            self._add_host(row[0], row[5])
                        out.runs += added
                        names.setdefault(row[0], row[1])
                    for row in other.rows("cells"):
                        out.cells += self._merge_cell(row, other.path, names, out.differing)
        finally:
            for other in others:
                other.close()
        return out

    def _add_host(self, run_id: str, source_env: str) -> None:
        """A run met again in another store (a shard run on another host): its host, GPUs (UUIDs) and scheduler task
        join the run's environment under `hosts`, so the merged run says where each of its cells ran (cells keep
        their `host`)."""
        (text,) = self.conn.execute("SELECT env FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        env, other = (boundary.loads_json(t, "a run's environment") for t in (text, source_env))
        hosts = env.setdefault("hosts", [host_entry(env)] if env.get("hostname") else [])
        entry = host_entry(other)
        if entry["hostname"] is None or entry in hosts:
            return
        hosts.append(entry)
        self.conn.execute("UPDATE runs SET env = ? WHERE run_id = ?", (json.dumps(env), run_id))

    def _merge_cell(self, row: tuple, source: str, names: dict[str, str], differing: list[str]) -> int:
        """Insert one cells row unless its (run, key) is here; 1 when it went in as a new cell."""
        cols = COLUMNS["cells"]
        insert = f"INSERT OR REPLACE INTO cells VALUES ({', '.join('?' * len(cols))})"  # key: (run_id, key)
        here = self.conn.execute(f"SELECT {', '.join(cols)} FROM cells WHERE run_id = ? AND key = ?",
                                 row[:2]).fetchone()
        if here is None:
            self.conn.execute(insert, row)
            return 1
        if here[2:-1] == row[2:-1]:  # the same result (all but run_id, key and created): a store merged twice
            return 0
        status = cols.index("status")
        replace = here[status] == "error" and row[status] != "error"
        if replace:
            self.conn.execute(insert, row)
        kept = f"{source}'s {row[status]}" if replace else f"the {here[status]} one already merged"
        differing.append(f"run '{names.get(row[0], row[0])}' cell {_key_text(row[1])}: {source} holds another result "
                         f"({row[status]} against {here[status]}); kept {kept}")
        return 0


def host_entry(env: dict) -> dict:
    """Where a store's run ran: its host, its GPUs (index, name, UUID) and its scheduler task."""
    return {"hostname": env.get("hostname"), "scheduler": env.get("scheduler") or {},
            "gpus": [{k: g.get(k) for k in ("index", "name", "uuid")} if isinstance(g, dict)
                     else {"index": None, "name": g, "uuid": None} for g in env.get("gpus") or []]}
# Record keys by their declared type (keys.py): a figure stored as text ("fast") was a TypeError in `runs`,
# `report` and `compare`, and `merge` copied it on. export.SPEED_KEYS is a subset (tests/test_input_boundary.py).
NUMBER_KEYS = frozenset(k.name for k in CATALOGUE if k.type in ("number", "integer"))
# Counts (a batch, samples, threads, requests): a batch_size of -1 or 1.5 was listed and compared as a setting. A seed
# is no count: any 64-bit integer seeds the weights and tokens, and `--seed -1` measured, then its cell's record made
# every later `runs --out`, `report` and `merge` refuse the store as damaged.
COUNT_KEYS = frozenset(k.name for k in CATALOGUE if k.type == "integer") - {"seed"}
TEXT_KEYS = frozenset(k.name for k in CATALOGUE if k.type == "string")
LIST_KEYS = frozenset(k.name for k in CATALOGUE if k.type == "array")
# Units (keys.py declares each key's) of figures that cannot be below zero or infinite: a time, a rate, a bandwidth,
# TFLOPS, a clock, power, energy, a 0..1 share. A latency_ms edited to -5 was compared as B/A -2.04. Not here: %
# (speedup and mem_saved are signed), C (a temperature), MiB (params_mb, optim_state_mb and activations_mb are
# allocator differences, which fall below zero where memory is freed in between: scenarios/training/loop.py) and the
# keys with no unit (a correlation, a loss, a count).
MAGNITUDE_UNITS = frozenset({"ms", "s", "1/s", "GB/s", "TFLOPS", "MHz", "W", "J", "fraction"})
MAGNITUDE_KEYS = frozenset(k.name for k in CATALOGUE if k.unit in MAGNITUDE_UNITS)
ENV_TEXT_KEYS = ("torch", "transformers", "cuda", "driver")


# What json.dumps writes between the brackets of a list of floats, and one JSON number (RFC 8259): a samples column
# of only these is read by decode_samples. json.loads made a Python float of each sample (24 bytes, and 8 more in its
# list, against 8 in an array): 6,000,000 samples of one cell (a 59 MB store) took compare and report to 1.2 GB.
_SAMPLE_TEXT = re.compile(r"[^0-9eE+\-., ]")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# The characters decode_samples checks and parses at a time, cut at a comma: re.subn over the whole text held a piece
# of text per sample, 6,000,000 of them.
SAMPLE_CHUNK = 1 << 20


def decode_samples(text: str):
    """A samples column holding a JSON list of numbers and nothing else, as a numpy float64 array with the values
    json.loads gives; None for any other text (the caller reads that through json, and refuses it as json does).
    Each number is checked against JSON's grammar, then parsed by numpy, never made a Python float."""
    import numpy as np

    end = len(text) - 1
    if text[:1] != "[" or text[-1:] != "]" or _SAMPLE_TEXT.search(text, 1, end):
        return None
    if not text[1:end].strip(" "):
        return np.empty(0) if end >= 1 else None
    n = text.count(",", 1, end) + 1
    out = np.empty(n)
    done, start = 0, 1
    while start < end:
        stop = text.find(",", min(start + SAMPLE_CHUNK, end), end)
        stop = end if stop < 0 else stop
        piece = text[start:stop]
        rest, k = _JSON_NUMBER.subn("", piece)
        if not k or done + k > n or rest.replace(" ", "") != "," * (k - 1):
            return None  # a number out of JSON's grammar (01, 1., .5, +1), a comma missing or doubled
        x = np.fromstring(piece, sep=",")
        if len(x) != k:
            return None
        out[done:done + k] = x
        done, start = done + k, stop + 1
    return out if done == n else None


def _column_problem(column: str, value) -> str | None:
    """What in a parsed column breaks its declaration, or None."""
    if column == "samples":
        import numpy as np

        # json reads NaN too; a NaN sample made every bootstrap bound NaN, and compare said `same`
        if not isinstance(value, np.ndarray) and not all(boundary.is_number(v) for v in value):
            return "a list that holds something other than finite numbers"
        x = np.asarray(value, dtype=np.float64)
        if not np.isfinite(x).all():
            return "a list that holds something other than finite numbers"
        below = np.flatnonzero(x < 0)
        negative = value[below[0]] if len(below) else None
        if negative is not None:
            # Samples are times in ms (CellResult.samples_ms, every scenario's): -1, -2, -3 were compared as `faster`
            # with a negative interval. 0 is a time a clock coarser than the call reads (measure/record.py guards it).
            return f"a list that holds a negative time ({negative:g} ms)"
    if column == "record":
        for k, v in value.items():
            if v is None:
                continue
            if k in NUMBER_KEYS and not (isinstance(v, (int, float)) and not isinstance(v, bool)):
                return f"a record whose {k} is {_JSON_NAME.get(type(v), type(v).__name__)}, not a number"
            # tables and compare divide it as a float
            if k in NUMBER_KEYS and isinstance(v, int) and not boundary.is_number(v):
                return f"a record whose {k} is an integer too large for a number"
            if k in COUNT_KEYS and not (isinstance(v, int) and v >= 0):
                return f"a record whose {k} is {v:g}, not a count (a whole number of 0 or more)"
            if k in MAGNITUDE_KEYS and not (boundary.is_number(v) and v >= 0):
                return f"a record whose {k} is {v:g}, not a finite number of 0 or more ({KEYS[k].unit})"
            if k in TEXT_KEYS and not isinstance(v, str):
                return f"a record whose {k} is {_JSON_NAME.get(type(v), type(v).__name__)}, not text"
            if k in LIST_KEYS:  # an export wrote {"busy_processes": "lots"}, which its own schema refuses
                # imported here: `python -m transbench.store.schema` warns where the package imported it first
                from .schema import list_problem

                problem = list_problem(k, v)
                if problem:
                    return f"a record whose {k} is {problem}"
    if column == "warnings" and not all(isinstance(w, str) for w in value):
        return "a list that holds something other than text"
    if column == "env":
        problem = _host_problem(value)
        if problem:
            return f"an environment whose {problem}"
        bad = next((k for k in ENV_TEXT_KEYS if isinstance(value.get(k), (dict, list))), None)
        if bad:
            return f"an environment whose {bad} is {_JSON_NAME[type(value[bad])]}, not text"
        hosts = value.get("hosts")
        if hosts is not None and not isinstance(hosts, list):
            return f"an environment whose hosts are {_JSON_NAME.get(type(hosts), 'other')}, not a list"
        problem = next((p for p in map(_host_problem, hosts or []) if p), None)
        if problem:  # merge adds to them (_add_host): a host entry of another shape was a traceback there
            return f"an environment whose hosts hold an entry whose {problem}"
    return None


def _host_problem(env) -> str | None:
    """What in a run's environment, or in one of its `hosts` entries (host_entry), is not where it ran."""
    if not isinstance(env, dict):
        return f"shape is {_JSON_NAME.get(type(env), 'other')}, not an object"
    gpus = env.get("gpus")
    if gpus is not None and not (isinstance(gpus, list) and all(  # a GPU as a bare name too (older stores)
            isinstance(g, str) or isinstance(g, dict) and isinstance(g.get("name", ""), str) for g in gpus)):
        return "gpus are not a list of GPUs (objects named by text, or names)"
    if not isinstance(env.get("hostname"), (str, type(None))):
        return f"hostname is {_JSON_NAME.get(type(env['hostname']), 'other')}, not text"
    if not isinstance(env.get("scheduler"), (dict, type(None))):
        return f"scheduler is {_JSON_NAME.get(type(env['scheduler']), 'other')}, not an object"
    return None


def cell_problem(record: dict, samples: list) -> str | None:
    """What in a cell about to be stored the store would refuse on reading it back, or None: a writer checks with
    the reader's own rules, so a cell it stores never makes the store read as damaged (an endpoint's usage of -3
    tokens gave tokens_per_s -12.75, and every later `runs`, `compare` and `--resume` of the store refused it)."""
    return _column_problem("samples", samples) or _column_problem("record", record)


def finite_json(value):
    """`value` with every float that is not finite as None (JSON's null): json.dumps writes NaN and Infinity, which
    no strict JSON reader takes (a cosine of NaN vectors, `reference_cosine_min`, reached `runs --out f.json` as a
    bare NaN). Keys the catalogue bounds are refused before this (cell_problem); elsewhere an undefined figure is
    none."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def _parsed(key: str):
    """A stored cell key as JSON, or None where it is none."""
    try:  # a stored key is a row read back: through the input boundary, its nesting bounded
        return boundary.loads_json(key, "cell key", fix="")
    except SpecError:
        return None


def _key_text(key: str) -> str:
    """A cell key (JSON of the settings that make the cell) as its set values: 'backend eager, batch 1, ...'."""
    settings = _parsed(key)
    if not isinstance(settings, dict):
        return _cut(key)
    return _cut(", ".join(f"{k} {v}" for k, v in settings.items() if v not in (None, False, "", 0, 0.0)))


# The characters of a stored text that a line about its row quotes: a damaged key of 200,000 brackets was quoted
# whole, an error line of 200 KB. A key transbench writes reads in about 150.
SHOWN = 300


def _cut(text: str, limit: int = SHOWN) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _is_date(text) -> bool:
    """The date of a run or a cell as _now() writes it (ISO 8601, extended form: '2025-01-01T00:00:00+00:00').
    `find_run('last')` orders runs by this text: a date edited to 5 (SQLite's TEXT affinity keeps it as '5') sorted
    after every real one, and 'last' was that run."""
    if not isinstance(text, str) or text[4:5] != "-":  # '20250101' reads as a date too, and sorts before '2025-...'
        return False
    try:
        _dt.datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


@dataclass
class Merged:
    """What merge_from did: runs and cells added, and a line per cell stored twice with other results."""
    runs: int = 0
    cells: int = 0
    differing: list[str] = field(default_factory=list)


# The libraries whose versions make a run's cells comparable: shards of one run that ran other versions are two runs.
VERSIONED = ("torch", "transformers", "triton", "transbench", "cuda")


def check_mergeable(others: list[Store], known: dict[str, tuple[dict, str]]) -> None:
    """Refuse stores whose runs cannot join `known` (name -> (run, the store it is in)) and each other, and any
    row that does not read back (damage is refused, not spread). A named run's id comes from its name, so two
    sweeps given one --name share it: the ids alone would join cells of another kind or another grid into one
    run (shards of one sweep differ only in where and how long they ran: RESUMABLE)."""
    by_id = {run["run_id"]: (run, path) for run, path in known.values()}
    for other in others:
        runs = other.runs()
        for r in runs:
            here, where = known.setdefault(r["name"], (r, other.path))
            named, named_in = by_id.setdefault(r["run_id"], (r, other.path))
            if named["name"] != r["name"]:  # a run renamed in one copy: its cells joined the other name's run, unsaid
                raise SpecError(f"run '{r['name']}' of {other.path} has the id of run '{named['name']}' of {named_in} "
                                f"({r['run_id']}): one run under two names; nothing was merged; rename one back, or "
                                "merge them into separate --into stores")
            differ = ([f"id {r['run_id']} vs {here['run_id']}"] if here["run_id"] != r["run_id"] else
                      [f"kind {r['kind']} vs {here['kind']}"] if here["kind"] != r["kind"] else
                      [f"{k} {json.dumps(r['spec'].get(k))} vs {json.dumps(here['spec'].get(k))}"
                       for k in sorted(set(here["spec"]) | set(r["spec"]))
                       if k not in RESUMABLE and here["spec"].get(k) != r["spec"].get(k)][:3]
                      or [f"{k} {r['env'].get(k)} vs {here['env'].get(k)}" for k in VERSIONED
                          if r["env"].get(k) != here["env"].get(k)][:3])
            if differ:
                raise SpecError(f"run '{r['name']}' of {other.path} is another run than the one of that name in "
                                f"{where} ({'; '.join(differ)}): nothing was merged; merge them into separate "
                                "--into stores")
        for r in runs:  # (a cell of no run: opening the store refused it, Store._check_orphans)
            other.cells(r["run_id"])


def check_sources(paths: list[str]) -> None:
    """check_mergeable on the sources alone, before the target is opened (created, when new): a refused merge
    leaves no empty store behind."""
    others = [Store(p, readonly=True) for p in paths]
    try:
        check_mergeable(others, {})
    finally:
        for other in others:
            other.close()
