"""The SQLite store: one row per run, one row per finished cell, one transaction per cell.

WAL journaling keeps the file consistent when the process is killed at any moment: a cell is either
fully stored or absent."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import sqlite3
import uuid
from pathlib import Path

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


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class Store:
    def __init__(self, path: str | Path = "transbench.db"):
        self.path = str(path)
        self.conn = sqlite3.connect(self.path, timeout=60, check_same_thread=False)  # lanes share it under a lock
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(SCHEMA)
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()

    # --- runs -----------------------------------------------------------------------------------
    def create_run(self, name: str | None, kind: str, spec: dict, env: dict) -> tuple[str, str]:
        # A named run has an id derived from its name, so shards of one sweep on several hosts share it
        # and `merge` joins their cells.
        if name:
            run_id = hashlib.sha256(name.encode()).hexdigest()[:12]
        else:
            run_id = uuid.uuid4().hex[:12]
            name = f"{kind}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{run_id[:4]}"
        with self.conn:
            self.conn.execute("INSERT INTO runs VALUES (?,?,?,?,?,?)",
                              (run_id, name, kind, _now(), json.dumps(spec), json.dumps(env)))
        return run_id, name

    def find_run(self, ref: str) -> dict | None:
        """A run by id, by name, or 'last' for the newest."""
        if ref == "last":
            row = self.conn.execute("SELECT * FROM runs ORDER BY created DESC, rowid DESC LIMIT 1").fetchone()
        else:
            row = self.conn.execute("SELECT * FROM runs WHERE run_id=? OR name=?", (ref, ref)).fetchone()
        return None if row is None else self._run(row)

    def runs(self) -> list[dict]:
        rows = self.conn.execute(
            "SELECT r.*, (SELECT COUNT(*) FROM cells c WHERE c.run_id=r.run_id) FROM runs r ORDER BY created, rowid"
        ).fetchall()
        return [{**self._run(r[:6]), "cells": r[6]} for r in rows]

    @staticmethod
    def _run(row) -> dict:
        return {"run_id": row[0], "name": row[1], "kind": row[2], "created": row[3],
                "spec": json.loads(row[4]), "env": json.loads(row[5])}

    # --- cells ----------------------------------------------------------------------------------
    def put_cell(self, run_id: str, key: str, scenario: str, status: str, record: dict, *, cell: dict,
                 samples: list | None = None, info: dict | None = None, warnings: list | None = None) -> None:
        with self.conn:  # one transaction: the cell is stored whole or not at all
            self.conn.execute(
                "INSERT OR REPLACE INTO cells VALUES (?,?,?,?,?,?,?,?,?,?)",
                (run_id, key, scenario, status, json.dumps(record, default=str), json.dumps(cell),
                 json.dumps(samples or []), json.dumps(info or {}, default=str), json.dumps(warnings or []), _now()),
            )

    def finished_keys(self, run_id: str) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT key FROM cells WHERE run_id=?", (run_id,))}

    def cells(self, run_id: str) -> list[dict]:
        rows = self.conn.execute(
            "SELECT key, scenario, status, record, cell, samples, info, warnings, created FROM cells "
            "WHERE run_id=? ORDER BY rowid", (run_id,)).fetchall()
        return [{"key": r[0], "scenario": r[1], "status": r[2], "record": json.loads(r[3]),
                 "cell": json.loads(r[4]), "samples": json.loads(r[5]), "info": json.loads(r[6]),
                 "warnings": json.loads(r[7]), "created": r[8]} for r in rows]

    # --- merge ----------------------------------------------------------------------------------
    def merge_from(self, other_path: str) -> tuple[int, int]:
        """Copy runs and cells from another store; a cell already here (same run, same key) is kept once.
        Returns (runs added, cells added)."""
        other = sqlite3.connect(other_path)
        runs_added = cells_added = 0
        with self.conn:
            for row in other.execute("SELECT * FROM runs"):
                cur = self.conn.execute("INSERT OR IGNORE INTO runs VALUES (?,?,?,?,?,?)", row)
                runs_added += cur.rowcount
            for row in other.execute("SELECT * FROM cells"):
                cur = self.conn.execute("INSERT OR IGNORE INTO cells VALUES (?,?,?,?,?,?,?,?,?,?)", row)
                cells_added += cur.rowcount
        other.close()
        return runs_added, cells_added
