import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Spawned workers import test-only backends from tests/ by module name.
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])


@pytest.fixture
def quick():
    """Timer options that keep a CPU cell to a fraction of a second."""
    return {"min_time": 0.01, "min_count": 3, "warmup": 1, "device": "cpu"}


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "t.db")


@pytest.fixture
def extra_backends(monkeypatch):
    """Registers test-only backend modules (tests/*_backends.py) in this process and in spawned workers."""
    from transbench import backends

    def register(*modules):
        monkeypatch.setenv("TRANSBENCH_EXTRA_BACKENDS", ",".join(modules))
        monkeypatch.setattr(backends, "_REGISTRY", None)

    yield register
    backends._REGISTRY = None


# The width output that is not a terminal gets (cli/tables.py); the tests that check what fits are written for it.
TERMINAL_WIDTH = 180


@pytest.fixture(autouse=True)
def terminal_width(monkeypatch):
    """One terminal width for every test, whatever the shell exports: pytest-xdist's workers start with COLUMNS=80,
    and the CLI's console reads COLUMNS once, when cli/tables.py is imported (perhaps while collecting)."""
    monkeypatch.setenv("COLUMNS", str(TERMINAL_WIDTH))
    tables = sys.modules.get("transbench.cli.tables")
    if tables is not None:
        monkeypatch.setattr(tables.console, "width", TERMINAL_WIDTH)

@pytest.fixture
def no_work(monkeypatch):
    """Any benchmark starting is a failure: output paths (tests/test_outputs.py, test_output_ownership.py) must be
    refused before it."""
    from transbench import api
    from transbench.scenarios import micro

    def started(*args, **kwargs):
        raise AssertionError("the work started before the output paths were checked")

    monkeypatch.setattr(micro, "run_micro", started)
    monkeypatch.setattr(api, "train", started)
    monkeypatch.setattr(api, "run", started)


@pytest.fixture
def unopenable(monkeypatch):
    """deny(path, mode): the store as a user who is not root meets a path it may not read or write (the tests run
    as root, which may do either): os.access says no for `mode` on `path`, and SQLite cannot open a store
    read-only, as it cannot where it may not read the -wal or -shm or make one."""
    import sqlite3

    from transbench.store import db as store_db

    real_access, real_connect = os.access, sqlite3.connect

    def deny(path, mode):
        monkeypatch.setattr(os, "access", lambda p, m, **kw: False if str(p) == str(path) and m == mode
                            else real_access(p, m, **kw))

        def connect(database, *args, **kwargs):
            if "mode=ro" in str(database) and "immutable" not in str(database):
                raise sqlite3.OperationalError("unable to open database file")
            return real_connect(database, *args, **kwargs)

        monkeypatch.setattr(store_db.sqlite3, "connect", connect)

    return deny
