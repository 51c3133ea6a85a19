"""A killed sweep's store (cells in its -wal file) in a folder that takes no new file: said as that, not damage."""

from __future__ import annotations

import os

import pytest

from transbench.errors import SpecError
from transbench.store import Store


def test_a_wal_store_in_a_read_only_folder_is_not_called_damaged(tmp_path, unopenable):
    path = tmp_path / "kw.db"
    store = Store(str(path))
    store.create_run("kw", "inference", {}, {"torch": "test", "gpus": []})
    store.close()
    (tmp_path / "kw.db-wal").write_bytes(b"\0" * 4096)  # stands for the -wal file a kill -9 leaves: no checkpoint
    # What a read-only mount does: no -shm can be made, so SQLite cannot open it.
    unopenable(tmp_path, os.W_OK)
    with pytest.raises(SpecError) as refused:
        Store(str(path), readonly=True)
    assert "damaged" not in str(refused.value)
    assert "-wal file (a sweep that did not end)" in str(refused.value) and "copy the store" in str(refused.value)
