"""A timestamped request trace (`--trace FILE`): JSON lines, each `{"timestamp": MS, "input_length": N,
"output_length": M}`, in time order. A Mooncake trace reads as it is (its `hash_ids`, and any other field, are
ignored). `--trace-speed X` replays X times faster (2: half the gaps; 0.5: twice them).

Read in the parent process to check it (one line and exit 2 for anything wrong) and again in the worker, which
verifies the digest the cell's key names: a trace changed in between, or under a resumed run, is an error, never
other requests under the same key."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

from ... import boundary
from ...errors import SpecError
from .lengths import MAX_FILE_NUMBER

MAX_FILE_BYTES = 256 * 2**20  # as a lengths file: past it, a file pointed at by mistake would be read for minutes
MAX_LINES = 1_000_000  # spec.MAX_REQUESTS: every request is planned before the load starts
FIELDS = "timestamp (ms), input_length and output_length"
KEYS = ('"timestamp"', '"input_length"', '"output_length"')  # as a line spells them


@dataclass(frozen=True)
class RequestTrace:
    times_s: tuple[float, ...]  # arrival times from the first request, at speed 1
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    name: str
    digest: str

    @property
    def source(self) -> str:
        return f"{self.name}@{self.digest}"

    def plan(self, speed: float) -> list[float]:
        return [t / speed for t in self.times_s]


def _field(row: dict, key: str, where: str, whole: bool) -> float:
    v = row.get(key)
    # an int of 400 digits is no finite float (is_number) but a number: the limit below refuses it, saying why
    if isinstance(v, bool) or not (isinstance(v, int) or boundary.is_number(v)):
        raise SpecError(f"{where}: '{key}' must be a number; each line needs {FIELDS}")
    if abs(v) > MAX_FILE_NUMBER:
        raise SpecError(f"{where}: '{key}' is past {MAX_FILE_NUMBER:,}, the largest number a trace may hold")
    if whole and (v != int(v) or v < 1):
        raise SpecError(f"{where}: '{key}' {v!r} is not a whole number of tokens of at least 1")
    if v < 0:
        raise SpecError(f"{where}: '{key}' must not be negative")
    return v


def _row(pairs: list, where: str) -> dict:
    """A line's object, where none of FIELDS is given twice: json keeps the last of two without a word, and
    `{"input_length": 8, "input_length": 8000}` was read as 8,000 tokens."""
    row = dict(pairs)
    if len(row) < len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen and f'"{key}"' in KEYS:
                raise SpecError(f"{where}: '{key}' is given twice: keep one")
            seen.add(key)
    return row


def read(name: str) -> RequestTrace:
    label = f"--trace {name}"
    path = boundary.user_path(name, label)
    try:
        if path.is_dir():
            raise SpecError(f"{label}: is a folder; give a JSON-lines file, one request a line with {FIELDS}")
        if not path.is_file():  # a pipe or a device (/dev/zero) is there, but no file to read
            raise SpecError(f"{label}: " + ("is not a regular file (a pipe, a device or a socket); give a JSON-lines "
                                            "file" if path.exists() else
                                            # a dangling link or a loop of links: said, not "no such file"
                                            boundary.link_nowhere(path) or "no such file"))
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SpecError(f"{label}: {size / 2**20:,.0f} MiB is above the {MAX_FILE_BYTES // 2**20} MiB read for a "
                            "trace: give a slice of it (head -n 100000)")
        data = boundary.read_bytes(path, label, limit=MAX_FILE_BYTES, fix="give a slice of it (head -n 100000)")
    except OSError as exc:
        raise SpecError(f"{label}: cannot be read ({exc.strerror or exc})") from None
    if b"\0" in data[:8192]:
        raise SpecError(f"{label}: is a binary file; give a JSON-lines text file")
    text = data.decode("utf-8-sig", errors="replace")
    times, inputs, outputs = [], [], []
    first = last = None
    for i, line in enumerate(_lines(text), 1):
        if not line.strip():
            continue
        where = f"{label} line {i}"
        if len(times) >= MAX_LINES:
            raise SpecError(f"{label}: more than {MAX_LINES:,} requests; give a slice of it")
        try:
            # each object through _row where a field's name may be there twice (or escaped): a hook on every line
            # read a trace of a million lines 20% slower
            twice = "\\" in line or any(line.count(key) > 1 for key in KEYS)
            row = boundary.loads_json(line, where, fix=f"each line is one object with {FIELDS}",
                                      pairs_hook=(lambda pairs: _row(pairs, where)) if twice else None)
        except boundary.BadInput:  # the JSON itself (_row's own line passes through)
            raise SpecError(f"{where}: not JSON; each line is one object with {FIELDS}") from None
        if not isinstance(row, dict):
            raise SpecError(f"{where}: not a JSON object; each line needs {FIELDS}")
        ts = _field(row, "timestamp", where, False)
        if last is not None and ts < last:
            raise SpecError(f"{where}: timestamp {ts:g} is before the line above's {last:g}; a trace is in time order")
        first = ts if first is None else first
        last = ts
        times.append((ts - first) / 1e3)
        inputs.append(int(_field(row, "input_length", where, True)))
        outputs.append(int(_field(row, "output_length", where, True)))
    if not times:
        raise SpecError(f"{label}: the file holds no requests (one JSON object a line)")
    return RequestTrace(tuple(times), tuple(inputs), tuple(outputs), path.name, hashlib.sha256(data).hexdigest()[:12])


def _lines(text: str):
    """text.splitlines(), one line at a time: the whole list held 25 bytes of memory for each byte of a file of
    blank lines (a 60 MB file 1.5 GB, one at MAX_FILE_BYTES over 6 GB), read in the parent and again in the worker.
    StringIO splits at \\n, \\r and \\r\\n; splitlines then at the breaks it adds (form feeds, U+2028, ...)."""
    for physical in io.StringIO(text, newline=""):
        yield from physical.splitlines()


def parse_speed(value: float) -> float:
    if not boundary.is_number(value) or value <= 0:
        raise SpecError(f"--trace-speed must be a finite number above 0, got {value!r}")
    return float(value)
