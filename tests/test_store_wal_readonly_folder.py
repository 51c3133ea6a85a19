"""A killed sweep's store (cells in its -wal file) in a folder that takes no new file: said as that, not damage."""

from __future__ import annotations

import os
import sqlite3

import pytest

from transbench.errors import SpecError
from transbench.store import Store
from transbench.store import db as store_db


def test_a_wal_store_in_a_read_only_folder_is_not_called_damaged(tmp_path, monkeypatch):
    path = tmp_path / "kw.db"
    store = Store(str(path))
    store.create_run("kw", "inference", {}, {"torch": "test", "gpus": []})
    store.close()
    (tmp_path / "kw.db-wal").write_bytes(b"\0" * 4096)  # stands for the -wal file a kill -9 leaves: no checkpoint
    # What a read-only mount does (a test run as root writes in any folder): no -shm can be made, so SQLite cannot open.
    real_access, real_connect = os.access, sqlite3.connect
    folder = str(tmp_path)
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p) == folder and mode == os.W_OK
                        else real_access(p, mode, **kw))

    def connect(database, *args, **kwargs):
        if "mode=ro" in str(database) and "immutable" not in str(database):
            raise sqlite3.OperationalError("unable to open database file")
        return real_connect(database, *args, **kwargs)

    monkeypatch.setattr(store_db.sqlite3, "connect", connect)
    with pytest.raises(SpecError) as refused:
        Store(str(path), readonly=True)
    assert "damaged" not in str(refused.value)
    assert "-wal file (a sweep that did not end)" in str(refused.value) and "copy the store" in str(refused.value)
