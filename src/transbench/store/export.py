"""Flat records with the contract's keys, baseline comparisons, and JSON/CSV export."""

from __future__ import annotations

import csv
import errno
import glob
import json
import os
import re
import shlex
import stat
import tempfile
import uuid
import zlib
from contextlib import contextmanager, suppress
from pathlib import Path

from .. import boundary, keys
from ..errors import SpecError
from .db import SIDE_FILES, Store, finite_json, side_file

# Every record has these keys, in this order (docs/records.md): None where one does not apply
# or the device cannot measure it (clock and power on a CPU), so a CPU run's export has a GPU run's columns.
RECORD_KEYS = keys.record_keys()
TRAINING_KEYS = keys.record_keys("training", always=True)
GENERATION_KEYS = keys.record_keys("generation", always=True)
# Figures a cell that is not `ok` never shows (its output was wrong or nothing was measured), in every scenario:
# inference and generation, serve (scenarios/serve/stats.py), training (scenarios/training/loop.py), energy.
SPEED_KEYS = ("latency_ms", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms", "latency_p999_ms",
              "latency_iqr_ms", "throughput_per_s", "tokens_per_s", "tflops", "mfu", "hfu", "samples_per_s",
              "tflops_per_gpu", "prefill_ms", "decode_ms_per_token", "decode_p90_ms_per_token", "ms_per_token",
              "speedup", "host_ms", "ttft_ms", "itl_p50_ms", "itl_p99_ms", "service_p50_ms", "service_p99_ms",
              "service_max_ms", "achieved_rate", "goodput", "forward_ms", "backward_ms", "optimizer_ms",
              "gain_samples_per_s", "scaling_efficiency", "j_per_seq", "j_per_request", "energy_j", "avg_power_w",
              "allreduce_ms", "comm_share", "allreduce_exposed_ms", "allreduce_busbw_gbs", "algbw_gbs", "busbw_gbs")


def point(rec: dict) -> tuple:
    """What makes two records comparable across backends."""
    return (rec.get("scenario"), rec.get("model"), rec.get("task"), rec.get("dtype"), rec.get("batch_size"),
            rec.get("seq_len"))


def apply_baseline(records: list[dict], baseline: str | None) -> list[dict]:
    """speedup % = (baseline latency / latency - 1) x 100; mem_saved % = (1 - peak / baseline peak) x 100. The
    baseline is the backend's unquantized cell (a record without `quant` is one): a quantized cell of any backend is
    measured against it."""
    if not baseline:
        return records
    base = {point(r): r for r in records if r.get("backend") == baseline and r.get("status") == "ok"
            and r.get("quant") in (None, "none")}
    for r in records:
        b = base.get(point(r))
        if r.get("status") != "ok" or b is None or r is b:
            continue
        if r.get("latency_ms") and b.get("latency_ms"):
            r["speedup"] = (b["latency_ms"] / r["latency_ms"] - 1) * 100
        if r.get("peak_mem_mb") and b.get("peak_mem_mb"):
            r["mem_saved"] = (1 - r["peak_mem_mb"] / b["peak_mem_mb"]) * 100
    return records


def check_baseline(baseline: str | None, recs: list[dict]) -> None:
    """A baseline (report --baseline, api.records) that no record's backend is: a misspelt one left every speedup None
    without a word. Records of no backend (micro runs) are not offered as one: the line read "use one of None"."""
    if baseline is None or any(r.get("backend") == baseline for r in recs):
        return
    present = sorted({r["backend"] for r in recs if isinstance(r.get("backend"), str)})
    fix = f"use one of {', '.join(present)}" if present else "they measure none: leave the baseline out"
    raise SpecError(f"baseline '{baseline}' is not a backend of these runs: {fix}")


def records(store: Store, run_refs: list[str] | None = None, baseline: str | None = None, *,
            by_id: bool = False) -> list[dict]:
    """The records of the runs named by `run_refs` (a name, an id or 'last'); `by_id`: they are run ids, each read
    as exactly that run (a run may be named like another run's id, and a name wins in find_run)."""
    find = store.run_by_id if by_id else store.find_run
    runs = [find(r) for r in run_refs] if run_refs else store.runs()
    out: list[dict] = []
    seen: set[str] = set()
    for run in runs:
        # A run named twice (`['a', 'a']`, its name and its id, or 'last') is read once, as `report` reads it: every
        # record came back twice, and a mean or a count over them was wrong without a word.
        if run is None or run["run_id"] in seen:
            continue
        seen.add(run["run_id"])
        out += run_records(run, store.cells(run["run_id"]), baseline)
    return out


def run_records(run: dict, cells: list[dict], baseline: str | None = None) -> list[dict]:
    """The records of one run's cells (Store.cells, in its order), against `baseline` or the run's own."""
    recs = []
    for c in cells:
        rec = {k: None for k in RECORD_KEYS}
        rec.update(c["record"])
        rec.update(run_id=run["run_id"], run_name=run["name"], status=c["status"])
        if rec["status"] != "ok":
            for k in SPEED_KEYS:
                rec[k] = None
        recs.append(rec)
    return apply_baseline(recs, baseline or run["spec"].get("baseline"))


def columns(recs: list[dict]) -> list[str]:
    extra = [k for k in (*GENERATION_KEYS, *TRAINING_KEYS) if any(k in r for r in recs)]
    rest = sorted({k for r in recs for k in r} - set(RECORD_KEYS) - set(extra))
    return [*RECORD_KEYS, *extra, *rest]


def write(recs: list[dict], json_path: str | None = None, csv_path: str | None = None, *, db: str | None = None,
          runs: list[dict] | None = None) -> None:
    """The --json / --csv exports of a command, where asked for. The run is stored by now, so a failure (a full
    disk, a file that became a SQLite database) is one line that says so, never a traceback. The JSON is the
    versioned record (store/schema.py) with the spec and environment of `runs` (store rows), else of the runs of
    `recs` read from the store `db`."""
    if json_path and runs is None:
        runs = runs_of(recs, db)
    for path, option, fill in ((json_path, "--json", lambda r, f: _fill_json(r, f, runs or [])),
                               (csv_path, "--csv", _fill_csv)):
        if path:
            with writing(path, recs):
                _refuse_sqlite(Path(path))  # again at write time: Python callers skip check_paths
                refuse_foreign(path, option, WRITES[option])
                with replacing(path) as f:
                    fill(recs, f)


def runs_of(recs: list[dict], db: str | None) -> list[dict]:
    """The stored runs the records belong to, in their order; without a store, what the records name."""
    ids = list(dict.fromkeys(r.get("run_id") for r in recs if r.get("run_id")))
    found: dict[str, dict] = {}
    if db and ids:
        store = Store(db, readonly=True)
        try:
            for run_id in ids:
                run = store.run_by_id(run_id)
                if run is not None:
                    found[run_id] = run
        finally:
            store.close()
    names = {r.get("run_id"): r.get("run_name") for r in recs}
    return [found.get(i) or {"run_id": i, "name": names.get(i) or i, "kind": "unknown", "created": "", "spec": {},
                             "env": {}} for i in ids]


def write_record(recs: list[dict], runs: list[dict], path: str) -> None:
    """The versioned record of these runs' records at `path` (`runs --out`)."""
    with writing(path):
        _refuse_sqlite(Path(path))
        refuse_foreign(path, "--out", RUNS_OUT)
        with replacing(path) as f:
            _fill_json(recs, f, runs)


def _open_special(path) -> int:
    """A descriptor of a path that is not a regular file, opened without blocking: a named pipe that no process
    reads made open() wait for ever (a report whose --json was a FIFO hung after the sweep). A pipe with a reader
    (`--json /dev/stdout | jq`) and a device open as before; the descriptor is made blocking again for the write."""
    import fcntl

    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise SpecError(f"cannot write {path}: it is a named pipe that no process reads; give a regular file, "
                            "or start the reader first") from None
        raise
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


@contextmanager
def replacing(path: str | Path, binary: bool = False):
    """A file (text, or bytes where `binary`) that becomes `path` once it is whole: written beside it, then moved over
    it. Opened in place, a disk that filled or a Ctrl-C part-way left a truncated file where the last run's good one
    had been. A symbolic link keeps pointing where it did (its target is replaced), an existing file keeps its
    permission bits; a path that is not a regular file (/dev/stdout, a pipe), or a writable file in a folder that
    takes no new file (check_output allows it), is written in place. Whether an existing file may be replaced at
    all is decided before (refuse_foreign)."""
    try:
        special = not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        special = False
    mode, newline = ("b", None) if binary else ("", "")
    # A lone surrogate (a name given in bytes that are not UTF-8, kept in a store written before spec.coerce refused
    # such text) is written as its escape: strict, `report` of such a run was a UnicodeEncodeError traceback.
    errors = None if binary else "backslashreplace"
    if special:  # by the path given: /dev/stdout on a pipe resolves to '/proc/PID/fd/pipe:[N]', a name not there
        with open(_open_special(path), "w" + mode, newline=newline, errors=errors) as f:
            yield f
        return
    target = Path(os.path.realpath(path))
    # A short name of its own: the target's name plus a suffix could pass the file system's longest name.
    tmp = target.with_name(f".transbench-{uuid.uuid4().hex[:12]}.tmp")
    try:
        f = open(tmp, "x" + mode, newline=newline, errors=errors)  # the mode `open(path, "w")` gives, never shared
    except PermissionError:
        with open(path, "w" + mode, newline=newline, errors=errors) as f:
            yield f
        return
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # whole on disk before it takes the name
        if target.exists():
            os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    """`path` holds `text` whole, or is as it was (replacing)."""
    with replacing(path) as f:
        f.write(text)


def append_text(path: str | Path, text: str) -> None:
    """`text` added at the end of `path`, created when missing (`compare --markdown`): its usual file is GitHub's
    $GITHUB_STEP_SUMMARY, which every step of a job appends to, and a summary written over it lost what the steps
    before had put there. A blank line goes between what is there and `text` (a line right under a markdown table
    is read as one more row of it); a write that fails part-way (a full disk) is cut back to the file's earlier
    length. /dev/stdout and pipes are written as any output is (replacing)."""
    try:
        special = not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        special = False
    if special:
        with open(_open_special(path), "w", newline="", errors="backslashreplace") as f:
            f.write(text)
        return
    with open(path, "a+b") as f:  # a+: the end can be read; every write goes to the end
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - 2))
        end = f.read()
        gap = b"" if not size or end.endswith(b"\n\n") else b"\n" if end.endswith(b"\n") else b"\n\n"
        try:
            f.write(gap + text.encode("utf-8", "backslashreplace"))  # a lone surrogate, as replacing() writes it
            f.flush()
        except BaseException:
            with suppress(OSError):
                f.truncate(size)
            raise


def save_figure(fig, path: str | Path, **kwargs) -> None:
    """A matplotlib figure saved as `path` whole, or `path` as it was (replacing): savefig on the path itself wrote
    in place, so a full disk or a Ctrl-C while drawing left a truncated plot where the last report's was. The format
    is the suffix's (`--plot roofline.svg` got PNG bytes before; no suffix matplotlib knows: PNG), and the file
    carries the mark `ours` recognises (plot_mark). An existing file that is not a plot of ours is refused, again
    at write time: a Python caller (plot_micro, the report's plots) may not have checked it."""
    fmt = _plot_format(Path(path))
    refuse_foreign(path, "", ("plot",))
    # Every text drawn literally: a run named `cost $x^2$` was drawn as math, and one with `$\undefined{$` failed
    # every plot of the report (matplotlib's mathtext parser). No label of ours is math; the tick labels of a log
    # axis's own formatter are (10^2), and the roofline's axes read `$\mathdefault{10^{0}}$` when this reached them.
    from matplotlib.ticker import LogFormatterMathtext

    formatted = {id(text) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
                 for ticks, fmt in ((axis.get_major_ticks(), axis.get_major_formatter()),
                                    (axis.get_minor_ticks(), axis.get_minor_formatter()))
                 if isinstance(fmt, LogFormatterMathtext) for tick in ticks for text in (tick.label1, tick.label2)}
    for text in fig.findobj(lambda artist: hasattr(artist, "set_parse_math")):
        if id(text) not in formatted:
            text.set_parse_math(False)
    with replacing(path, binary=True) as f:
        if fmt == "pgf":  # LaTeX source, no metadata: the mark is its first line, a TeX comment
            f.write(f"%% {plot_creator()}\n".encode())
        fig.savefig(f, format=fmt, **{**plot_mark(fmt), **kwargs})


def _fill_json(recs: list[dict], f, runs: list[dict]) -> None:
    from .schema import record_document

    # Strict JSON: a store written before its writer kept non-finite figures out may still hold a NaN.
    json.dump(finite_json(record_document(recs, runs, columns(recs))), f, indent=1, default=str, allow_nan=False)


def _fill_csv(recs: list[dict], f) -> None:
    cols = columns(recs)
    w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for r in recs:
        w.writerow({k: _csv_value(r.get(k)) for k in cols})


def _csv_value(value):
    """A record's value in a CSV cell: lists and objects as the JSON record writes them (Python's repr, with single
    quotes and True, was no format a CI script reads), switches as JSON's true and false, none as empty."""
    if value is None:
        return ""
    if isinstance(value, (list, dict, bool)):
        return json.dumps(finite_json(value), default=str, allow_nan=False)
    return value


# --- output paths ------------------------------------------------------------------------------------------
# Every file a command writes besides the store (--json, --csv, --plot, `runs --out`, the report's files, compare's
# outputs) is checked here before any work starts (a sweep can take hours), and written inside `writing`, so bad
# input is one line (SpecError) and nothing that is not ours is overwritten: an existing file is replaced only when
# `ours` recognises it as what transbench writes at that option (a rerun replaces its previous output), and
# `compare --markdown` appends.

SQLITE_HEADER = b"SQLite format 3\x00"
# A file name to suggest when a folder is given where a file belongs.
EXAMPLE_NAME = {"--json": "records.json", "--csv": "records.csv", "--plot": "plot.png", "--out": "spec.yaml"}


def is_sqlite(path: Path) -> bool:
    """A regular file that starts with SQLite's header: some store or another application's database. Only a
    regular file is read: reading a FIFO or a device could block or consume its data."""
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as f:
            return f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:  # unreadable: what it holds is unknown, and the write itself will tell
        return False


def check_paths(json_path: str | None, csv_path: str | None, db: str | None = None, *,
                plot: str | None = None) -> None:
    """A command's outputs (--json, --csv, --plot; None where not asked for), checked before it spends its
    time: each as in `check_output`, and no two the same file."""
    given = {o: p for o, p in (("--json", json_path), ("--csv", csv_path), ("--plot", plot)) if p is not None}
    for option, path in given.items():
        if path == "-":  # compare --json and runs --out read "-" as stdout; here it made a file named "-", exit 0
            raise SpecError(f"{option} -: this command writes its {option[2:]} to a file, and its table to stdout: "
                            "give a file path (./- for a file named -)")
        check_output(path, option, db)
    options = list(given)
    for i, option in enumerate(options):
        for other in options[:i]:
            if _same_file(Path(given[option]), Path(given[other])):
                raise SpecError(f"{other} and {option} both write {given[option]}: give them different files")


def check_output(path: str, option: str, db: str | None = None, *, image: bool = False,
                 writes: str | tuple[str, ...] | None = None, append: bool = False,
                 example: str | None = None) -> None:
    """One file a command will write: not empty, not the store `db` (nor its journal), not a folder, in a
    folder that exists and is writable, never over a SQLite database, and for a plot (`image`, or `writes`
    "plot") a format matplotlib writes (by the suffix). `writes`: the kinds of file the option writes (KINDS;
    default WRITES[option]): an existing non-empty regular file is replaced only when `ours` recognises it as one
    of them, so a rerun replaces its previous output and a user's file is refused (refuse_foreign); an empty file,
    a new path, /dev/stdout and pipes are written. With `append` (compare --markdown) the file is added to, never
    replaced: an existing one need only hold text. `example`: the file name a folder given as `path` is told to
    hold (default EXAMPLE_NAME[option]). Nothing is created or changed here."""
    if not str(path).strip():  # `--json ' '` wrote a file named ' ' (api.py's _path refuses it too)
        raise SpecError(f"{option} is empty: give a file path")
    kinds = () if append else _kinds(writes if writes is not None else WRITES[option])
    with writing(path):  # a name too long, a symlink loop: one line too
        _check_file(Path(path), option, db, image or "plot" in kinds, example)
        if append:
            _refuse_binary(Path(path), option)
        else:
            refuse_foreign(path, option, kinds)


# --- whose file it is ----------------------------------------------------------------------------------------
# An existing file is replaced only when it is recognisably what transbench writes at that option; each kind is
# told from what this code writes, reading at most a few KiB of it (HEAD_BYTES from its start, as much from its end).

KINDS = ("json", "benchmark", "csv", "spec", "report.md", "report.html", "plot")
# The kinds each option of run/serve/train/micro (check_paths, api.check_outputs) writes; `runs --out` writes the
# JSON record without --spec and a spec with it; compare, report and `runs --out` pass theirs to check_output.
WRITES = {"--json": ("json",), "--csv": ("csv",), "--plot": ("plot",)}
RUNS_OUT = ("json", "spec")
HEAD_BYTES = 4096
# The first line of report.md and the line after report.html's doctype (report/document.py, report/html.py).
REPORT_MARK = "<!-- written by transbench report -->"
# The first line of a YAML or TOML spec `runs --spec RUN --out FILE` writes (cli/info.py); a comment to both.
SPEC_MARK = "# written by transbench runs --spec"


def spec_mark(name: str, kind: str) -> str:
    """The first line of a spec file written from the run `name` of `kind` (a db.RUN_KINDS)."""
    return f"{SPEC_MARK}: run {name!r} ({kind})"


def spec_kind(path: str) -> str | None:
    """The kind of run a spec file was written from, read from its first line's mark (spec_mark); None where it has
    none (a JSON spec, a file the user wrote) or is no regular file that can be read (the spec's own reading says
    why). Opened without blocking: a named pipe with no writer blocked `run --spec` for ever here."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        first = os.read(fd, HEAD_BYTES).split(b"\n", 1)[0].decode("utf-8", "replace").rstrip()
    except OSError:
        return None
    finally:
        os.close(fd)
    found = re.fullmatch(re.escape(SPEC_MARK) + r": run .* \((\w+)\)", first)
    return found.group(1) if found else None


# The record's first columns in every export since the first (docs/records.md; RECORD_KEYS begins with them, and
# keys added later went after them), so an older export is recognised too.
CSV_HEAD = ("run_id", "run_name", "scenario", "model", "task", "backend")
_STRING = rb'"(?:[^"\\]|\\.)*"'
# The versioned record or comparison (schema.py record_document, report/compare.py comparison_document: these keys
# first, in this order); before the versioned record, --json wrote a list of records (each beginning with run_id).
_RECORD = re.compile(rb'\s*\{\s*"schema_version"\s*:\s*\d+\s*,\s*"transbench_version"\s*:\s*' + _STRING
                     + rb'\s*,\s*"kind"\s*:\s*"(?:record|comparison)"')
_OLD_RECORDS = re.compile(rb'\s*\[\s*(?:\]\s*\Z|\{\s*"run_id"\s*:)')
# github-action-benchmark's customSmallerIsBetter list as report/compare.py github_benchmark writes it: objects
# whose keys begin name, unit, value; an empty list where run B had no ok cell.
_BENCHMARK = re.compile(rb'\s*\[\s*(?:\]\s*\Z|\{\s*"name"\s*:\s*' + _STRING + rb'\s*,\s*"unit"\s*:\s*' + _STRING
                        + rb'\s*,\s*"value"\s*:)')
# The report before REPORT_MARK: the title and first section report/__init__.py has always begun with.
_OLD_MARKDOWN = re.compile(rb"# transbench report: [^\n]*\n\n## Runs\n")
_OLD_HTML = b'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>transbench report: '
# Where each format keeps the creator plot_mark gives it, as bytes of the file (svgz: of its decompressed start).
_PLOT_MARKS = {
    "png": rb"tEXtSoftware\x00transbench ",
    "svg": rb"<dc:creator>\s*<cc:Agent>\s*<dc:title>transbench ",
    "pdf": rb"/Creator \(transbench ",
    "eps": rb"%%Creator: transbench ",
    "ps": rb"%%Creator: transbench ",
    "pgf": rb"\A%% transbench ",
    "jpg": rb"\xff\xfe..transbench ",  # a COM segment: marker, 2 bytes of length, the text
    "gif": rb"!\xfe.transbench ",  # a comment extension: introducer, label, the first block's length
    "tif": rb"\A(?:II\*\x00|MM\x00\*).*transbench ",  # ImageDescription: after the first IFD, near the start
    "webp": rb'xmp:CreatorTool="transbench ',
}
_PLOT_MARKS.update(svgz=_PLOT_MARKS["svg"], jpeg=_PLOT_MARKS["jpg"], tiff=_PLOT_MARKS["tif"], avif=_PLOT_MARKS["webp"])


def _kinds(writes: str | tuple[str, ...]) -> tuple[str, ...]:
    kinds = (writes,) if isinstance(writes, str) else tuple(writes)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown output kind(s) {sorted(unknown)}: one of {KINDS}")
    return kinds


def ours(path: str | Path, writes: str | tuple[str, ...]) -> bool:
    """Whether the existing file `path` is one transbench writes as `writes` (a kind of KINDS, or several):
    json: the versioned record or comparison (or the list of records --json wrote before it); benchmark: the
    customSmallerIsBetter list; csv: a header beginning with CSV_HEAD; spec: SPEC_MARK on the first line of a
    YAML/TOML spec, a JSON spec by its shape (spec.dump_text's json.dumps, indent 1, read whole: a spec is small);
    report.md / report.html: REPORT_MARK, or the start an older report always had; plot: the creator plot_mark
    wrote in that format's metadata, or a PNG of matplotlib's beside a report.md of ours (the report's plots before
    they were marked). A file that cannot be read is not known to be ours."""
    p = Path(path)
    kinds = _kinds(writes)
    try:
        with open(p, "rb") as f:
            head = f.read(HEAD_BYTES)
            whole = not f.read(1)
    except OSError:
        return False
    return any(_RECOGNISE[k](p, head, whole) for k in kinds)


def _csv(p: Path, head: bytes, whole: bool) -> bool:
    try:
        first = next(csv.reader([head.split(b"\n", 1)[0].decode("utf-8").rstrip("\r")]), [])
    except (UnicodeDecodeError, csv.Error):  # a lone carriage return inside the line (b"\r\x00") is csv's error
        return False
    return tuple(first[:len(CSV_HEAD)]) == CSV_HEAD


def _spec(p: Path, head: bytes, whole: bool) -> bool:
    if head.startswith(SPEC_MARK.encode()):
        return True
    if p.suffix.lower() != ".json" or not head.lstrip().startswith(b"{"):
        return False
    # A spec dump_text writes is a few hundred bytes: a longer file is read no further, and is not one.
    try:  # through the input boundary, as every file read from outside is (tests/test_input_boundary.py)
        text = boundary.read_text(p, "output file", limit=4 * HEAD_BYTES)
        data = boundary.loads_json(text, "output file")
    except SpecError:  # unreadable, too long, not UTF-8 or not JSON: not a spec of ours
        return False
    # spec.dump_text's JSON byte for byte: the spec's options with one space of indent, which is not how a file
    # is written by hand (a copy of one of ours is ours).
    return isinstance(data, dict) and bool(data) and text == json.dumps(data, indent=1) + "\n"


def _plot(p: Path, head: bytes, whole: bool) -> bool:
    fmt = _plot_format(p)
    if fmt in ("raw", "rgba"):  # bare pixels, no room for a mark: an existing one is never known to be ours
        return False
    if fmt == "svgz":
        with suppress(zlib.error):
            head = zlib.decompressobj(wbits=31).decompress(head, HEAD_BYTES)
    mark = re.compile(_PLOT_MARKS[fmt], re.DOTALL)
    if mark.search(head) or any(mark.search(part) for part in _ends(p, fmt, whole)):
        return True
    return (fmt == "png" and head.startswith(b"\x89PNG") and b"tEXtSoftware\x00Matplotlib" in head
            and ours(p.parent / "report.md", "report.md"))


def _ends(p: Path, fmt: str, whole: bool) -> list[bytes]:
    """Where a mark sits at a file's end: WebP's XMP chunk; a PDF's Info dictionary, written just before the
    cross-reference table that `startxref` (at the very end) points to, which grows with the plot's objects."""
    if whole:
        return []
    try:
        with open(p, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - HEAD_BYTES))
            tail = f.read()
            parts = [tail]
            found = re.search(rb"startxref\s+(\d+)\s+%%EOF\s*\Z", tail) if fmt == "pdf" else None
            if found:
                at = int(found.group(1))
                f.seek(max(0, at - HEAD_BYTES))
                parts.append(f.read(min(at, HEAD_BYTES)))
    except OSError:
        return []
    return parts


_RECOGNISE = {
    "json": lambda p, head, whole: bool(_RECORD.match(head) or _OLD_RECORDS.match(head)),
    "benchmark": lambda p, head, whole: bool(_BENCHMARK.match(head)),
    "csv": _csv,
    "spec": _spec,
    "report.md": lambda p, head, whole: (head.startswith(REPORT_MARK.encode() + b"\n")
                                         or bool(_OLD_MARKDOWN.match(head))),
    "report.html": lambda p, head, whole: (head.startswith(b"<!DOCTYPE html>\n" + REPORT_MARK.encode() + b"\n")
                                           or head.startswith(_OLD_HTML)),
    "plot": _plot,
}


def refuse_foreign(path: str | Path, option: str, writes: str | tuple[str, ...], *,
                   instead: str = "another path") -> None:
    """A SpecError, one line, for an existing non-empty regular file at `path` that `ours` does not recognise as a
    kind `writes`: replacing it would lose what a user put there (`compare --json notes.md` did). A new path, an
    empty file, /dev/stdout, a pipe or a device pass."""
    p = Path(path)
    try:
        st = os.stat(p)
    except (OSError, ValueError):  # not there (or unreachable: the write says why)
        return
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0 or ours(p, writes):
        return
    at = f" ({option})" if option else ""
    why = ("it exists and cannot be read to tell whether transbench wrote it" if not os.access(p, os.R_OK)
           else "it exists and is not a file transbench wrote")
    raise SpecError(f"cannot write {p}: {why}{at}: remove it, or give {instead}")


def _refuse_binary(p: Path, option: str) -> None:
    """What `compare --markdown` appends to must hold text: a plot or an archive given by mistake would be
    changed, and no reader would show the summary."""
    try:
        if not p.is_file():
            return
        with open(p, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:  # the write will tell
        return
    try:
        head.decode("utf-8")
        text = b"\0" not in head
    except UnicodeDecodeError as e:
        text = b"\0" not in head and e.start >= len(head) - 3 and len(head) == HEAD_BYTES  # a character cut at the end
    if not text:
        raise SpecError(f"cannot write {p}: it is not a text file, and {option} adds markdown at the end of an "
                        "existing file: give a text file (e.g. $GITHUB_STEP_SUMMARY), or another path")


def plot_creator() -> str:
    """The creator a plot names in its metadata: what `ours` looks for."""
    from .schema import version

    return f"transbench {version()}"


def plot_mark(fmt: str) -> dict:
    """savefig's arguments that put plot_creator() in a `fmt` file: matplotlib's metadata where its writer takes
    some, Pillow's comment, description or XMP for the formats Pillow writes; none for raw/rgba (pixels only)."""
    creator = plot_creator()
    if fmt == "png":
        return {"metadata": {"Software": creator}}
    if fmt in ("pdf", "svg", "svgz", "eps", "ps"):
        return {"metadata": {"Creator": creator}}
    if fmt in ("jpg", "jpeg", "gif"):
        return {"pil_kwargs": {"comment": creator}}
    if fmt in ("tif", "tiff"):
        return {"pil_kwargs": {"description": creator}}
    if fmt in ("webp", "avif"):
        xmp = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
               '<rdf:Description xmlns:xmp="http://ns.adobe.com/xap/1.0/" '
               f'xmp:CreatorTool="{creator}"/></rdf:RDF></x:xmpmeta>')
        return {"pil_kwargs": {"xmp": xmp.encode()}}
    return {}


def _plot_format(p: Path) -> str:
    """The format matplotlib writes for the suffix (check_output refused any other on --plot); PNG otherwise."""
    suffix = p.suffix.lower().lstrip(".")
    return suffix if suffix in _PLOT_MARKS or suffix in ("raw", "rgba") else "png"


def _check_file(p: Path, option: str, db: str | None, image: bool, example: str | None = None) -> None:
    path = str(p)
    if db and _is_store(p, Path(db)):
        raise SpecError(f"cannot write {path}: it is the store (--db); writing there would overwrite every "
                        "stored run: give another file")
    if p.is_symlink() and not p.exists() and Path(os.path.realpath(p)).is_symlink():
        raise SpecError(f"cannot write {path}: it is a symbolic link in a loop: give another file")
    if p.is_dir():
        raise SpecError(f"cannot write {path}: it is a folder; give a file path such as "
                        f"{p / (example or EXAMPLE_NAME.get(option, 'out.txt'))}")
    # A link to no file yet is written at its target (replacing): a target in a missing folder was let through and
    # failed at the write, after the work ("No such file or directory"; `run --json` measured first).
    dangling = p.is_symlink() and not p.exists()
    folder = Path(os.path.realpath(p)).parent if dangling else p.parent
    link = f"it is a symbolic link to {os.path.realpath(p)}, and " if dangling else ""
    if not folder.is_dir():
        # The nearest part that is there: under a file (notes.txt/sub/x.json), "create it first" could not be done
        there = boundary.file_above(folder)
        if there is not None:
            raise SpecError(f"cannot write {path}: {link}it is inside {there}, which is a file, not a folder")
        raise SpecError(f"cannot write {path}: {link}folder {folder} does not exist (create it first)")
    _refuse_kernel_fs(p, path)
    # An existing file needs only itself writable (e.g. /dev/stdout); a new one needs its folder.
    if not (os.access(p, os.W_OK) if p.exists() else os.access(folder, os.W_OK | os.X_OK)):
        raise SpecError(f"cannot write {path}: {'the file' if p.exists() else f'folder {folder}'} is not "
                        "writable (choose another path)")
    _refuse_sqlite(p)
    if image:
        _check_image_format(p, option)


# The kernel's own file systems: their files are the kernel's settings and views, not results. /proc and /sys take
# no new file, so a results file there failed only once it was written, after the measuring
# (`run --csv /proc/self/status`), and a few of their files are writable in place (as root, /proc/sys/...).
KERNEL_FS = frozenset({"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs", "configfs", "bpf",
                       "pstore", "efivarfs", "fusectl", "binfmt_misc", "selinuxfs", "mqueue"})


def kernel_fs(path: str | Path) -> str | None:
    """The type of the kernel file system (KERNEL_FS) that holds `path`, by the deepest mount point above it in
    /proc/self/mountinfo; None elsewhere, and where the table cannot be read (not Linux)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            table = f.read()
        real = os.path.realpath(path)
    except (OSError, ValueError):  # ValueError: a NUL in the path (the write says why)
        return None
    deepest, kind = "", None
    for line in table.splitlines():
        fields = line.split()
        if "-" not in fields[5:]:
            continue
        # The mount point is the fifth field, its spaces and other odd bytes written as octal escapes.
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(deepest):
            deepest, kind = mount, fields[fields.index("-", 5) + 1]
    return kind if kind in KERNEL_FS else None


def _refuse_kernel_fs(p: Path, shown: str) -> None:
    """A new path or a regular file there. A pipe or a device is written as given: /dev/stdout leads through
    /proc/self/fd to a terminal or to a pipe that /proc names."""
    try:
        mode = os.stat(p).st_mode
        special = not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))
    except (OSError, ValueError):
        special = False
    fs = None if special else kernel_fs(p)
    if fs:
        raise SpecError(f"cannot write {shown}: it is in the kernel's {fs} file system, which holds no results: "
                        "give a path in an ordinary folder")


def _is_store(p: Path, db: Path) -> bool:
    """`p` is the store or one of the files SQLite keeps beside it (overwriting those corrupts it too)."""
    return any(_same_file(p, side_file(str(db), tail)) for tail in ("", *SIDE_FILES))


def _same_file(a: Path, b: Path) -> bool:
    """Also through a symbolic or a hard link."""
    try:
        return os.path.samefile(a, b) if a.exists() and b.exists() else a.resolve() == b.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        return False


def _refuse_sqlite(p: Path) -> None:
    if is_sqlite(p):
        raise SpecError(f"cannot write {p}: it is a SQLite database (a store?), left as it is: give another file")
    # A path named as SQLite names a database's side files (x.db-wal beside the store x.db): `compare --json x.db-wal`
    # wrote its JSON there, a reader of x.db then made x.db-shm for it, and over the empty -wal file of a sweep
    # between checkpoints it replaced the file the sweep's next cells went to.
    try:
        names = dict.fromkeys((str(p), os.path.realpath(p)))
    except (OSError, ValueError):  # a NUL in the path: the write says why
        return
    for name in names:
        side = next((suffix for suffix in SIDE_FILES if name.endswith(suffix)), None)
        if side and is_sqlite(Path(name[:-len(side)])):
            raise SpecError(f"cannot write {p}: it is named as SQLite names a side file ({side}) of the database "
                            f"{name[:-len(side)]} (a store?), where SQLite keeps its unfinished writes: give another "
                            "file")


def _check_image_format(p: Path, option: str) -> None:
    """matplotlib picks the format by the suffix: none would append '.png' to the name (`--plot .` wrote
    './.png'), an unknown one fails only after the work."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = p.suffix.lower().lstrip(".")
    if suffix not in formats:
        got = f"'.{suffix}' is not an image format matplotlib writes" if suffix else "the name has no suffix"
        raise SpecError(f"cannot write {p}: {got}; end the {option} name in .png (or one of "
                        f"{', '.join(sorted(formats))})")


def check_folder(path: str | Path, option: str, names: dict[str, str] | None = None) -> Path:
    """A folder a command writes files into (`report --out`), created when missing: not empty, not a file,
    really writable (a file is made and removed: permissions do not stop root, and /proc takes no files), and
    every existing file matching one of the glob patterns `names` (what will be replaced; pattern -> the kind of
    file written there, KINDS) neither a SQLite database nor a file that is not ours (refuse_foreign)."""
    if not str(path).strip():  # `--out ' '` made a folder named ' '
        raise SpecError(f"{option} is empty: give a folder")
    out = Path(path)
    _refuse_kernel_fs(out, str(out))
    # One level at a time, so that a refused folder leaves none of those made for it: `--out new/NAME` with a NAME
    # too long made `new` before failing (mkdir(parents=True)), and pathlib's exists() raised for a NAME too long
    # before Python 3.13 (a traceback).
    made: list[Path] = []
    made_all = False
    try:
        if out.exists() and not out.is_dir():
            raise SpecError(f"{option} {out} is a file: give a folder")
        there = boundary.file_above(out.parent)
        if there is not None:  # mkdir said only "Not a directory"
            raise SpecError(f"{option} {out} is inside {there}, which is a file, not a folder: give another folder")
        if out.is_symlink() and not out.exists():  # mkdir said only "File exists" of a name that leads nowhere
            raise SpecError(f"{option} {out} is a symbolic link to {os.readlink(out)}, which is no folder (missing, or "
                            "a loop of links): make the folder it points to, or give another folder")
        for folder in reversed((out, *out.parents)):
            if not folder.exists():
                folder.mkdir()
                made.append(folder)
        made_all = True
        with tempfile.TemporaryFile(dir=out):
            pass
    except (OSError, SpecError) as e:
        for folder in reversed(made):
            with suppress(OSError):
                folder.rmdir()
        if isinstance(e, SpecError):
            raise
        if not made_all:
            raise SpecError(f"cannot create the folder {out} ({option}): {e.strerror or e}") from None
        raise SpecError(f"cannot write in the folder {out} ({option}): a file made there failed "
                        f"({e.strerror or e}): give another folder") from None
    for pattern, kind in (names or {}).items():
        literal = out / pattern  # glob skips a link to nothing, which the write then failed on
        for f in sorted(out.glob(pattern)) if glob.has_magic(pattern) else [literal] * os.path.lexists(literal):
            if not f.is_file():  # report.md a folder or a pipe failed after the plots were written; a plot's name
                # taken by a folder lost that plot without a word
                what = "a folder" if f.is_dir() else "not a regular file (a pipe, a device, or a link to nothing)"
                raise SpecError(f"cannot write {f}: it is {what}, and {option} writes a file of that name there: "
                                "remove it, or give another folder")
            _refuse_sqlite(f)
            refuse_foreign(f, option, (kind,), instead="another folder")
    return out


@contextmanager
def writing(path: str | Path, recs: list[dict] | None = None):
    """Where an output is written after the work: an OSError (a full disk, /proc) or a SpecError becomes one
    line; with the stored run's records `recs`, it says the run is safe and how to get the file again (a
    rerun with its name resumes it: nothing is measured again, and its outputs are written anew)."""
    try:
        yield
    except (OSError, SpecError) as e:
        why = f"cannot write {path}: {e.strerror or e}" if isinstance(e, OSError) else str(e)
        raise SpecError(why + _stored_note(recs)) from None


def _stored_note(recs: list[dict] | None) -> str:
    name = (recs or [{}])[0].get("run_name")
    if not name:
        return ""
    return (f"; run {name!r} is stored: to write it again, rerun the same command with --name "
            f"{shlex.quote(name)} and a path that can be written (its cells are not measured again)")
