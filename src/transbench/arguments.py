"""The Python API's checks of its arguments, before anything runs or is stored: what the command line's parser
and declarations check for the CLI (a path given as None, a callback that is not a function, resume="no")."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import SpecError
from .store import export
from .store.db import EMPTY_STORE


def check_path(value, what: str = "db") -> str:
    """A store or output path given in Python: `db=None` made a store named `None` in the current folder."""
    if isinstance(value, (str, os.PathLike)) and not str(value).strip():  # as the store says it for every command
        raise SpecError(EMPTY_STORE if what == "db" else f"{what} is empty: give a file path")
    if not isinstance(value, (str, os.PathLike)):
        raise SpecError(f"{what} must be a file path (text), got {value!r}")
    if "\0" in str(value):  # the command line cannot pass one; given here it was os.stat's ValueError, a traceback
        raise SpecError(f"{what} {str(value)!r:.200} holds a NUL character, which no file path can: give a file path")
    return os.fspath(value)


def check_names(values, what: str) -> list[str]:
    """Run names, or store paths: one text is a list of one (`records(db, "a")` looked up runs 'a' and 'b'
    of "ab", letter by letter); anything but text is a SpecError, not an AttributeError deep inside."""
    if isinstance(values, (str, os.PathLike)):
        values = [values]
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, (str, os.PathLike)) for v in values):
        raise SpecError(f"{what}: expected a list of names (text), got {values!r}")
    return [os.fspath(v) for v in values]


def check_outputs(db: str, json_path, csv_path) -> str:
    """The store and export paths, checked before anything runs, as the CLI does: a bad --json path was
    found only after the whole sweep."""
    db = check_path(db)
    export.check_paths(None if json_path is None else check_path(json_path, "json_path"),
                       None if csv_path is None else check_path(csv_path, "csv_path"), db)
    return db


def check_callbacks(**given) -> None:
    """on_start / on_cell / on_probe given as None or a non-function were called only once the store held the new
    run: a TypeError after the store was made, or after the first cell was measured."""
    for what, fn in given.items():
        if not callable(fn):
            raise SpecError(f"{what} must be a function, got {fn!r}")


def check_keywords(given: dict, allowed: tuple[str, ...], function: str) -> None:
    """A keyword a function passes on (**kwargs) that it does not take: a TypeError from deep inside, naming another
    function (`train(spec, on_cel=print)`)."""
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise SpecError(f"{function}() takes no keyword {unknown[0]!r}: it takes {', '.join(allowed)}")


def keywords_of(fn, kwargs: dict, function: str) -> dict:
    """kwargs, checked against the keyword-only parameters of the scenario function `fn` that api.`function` passes
    them on to: `api.run(spec, on_cel=print)` was Python's TypeError where train's and report's are a SpecError."""
    import inspect

    check_keywords(kwargs, tuple(p.name for p in inspect.signature(fn).parameters.values()
                                 if p.kind is p.KEYWORD_ONLY), function)
    return kwargs


def check_flag(value, what: str) -> bool:
    """resume="no" is a true value: it asked for a resume (and refused a new store) rather than a fresh run."""
    if not isinstance(value, bool):
        raise SpecError(f"{what} must be True or False, got {value!r}")
    return value


@dataclass
class RunOutcome:
    run_id: str
    name: str
    records: list[dict]
    resumed: bool = False
