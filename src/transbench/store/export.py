"""Flat records with the contract's keys, baseline comparisons, and JSON/CSV export."""

from __future__ import annotations

import csv
import errno
import json
import os
import shlex
import stat
import tempfile
import uuid
from contextlib import contextmanager, suppress
from pathlib import Path

from .. import keys
from ..errors import SpecError
from .db import Store

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


def records(store: Store, run_refs: list[str] | None = None, baseline: str | None = None) -> list[dict]:
    runs = [store.find_run(r) for r in run_refs] if run_refs else store.runs()
    out: list[dict] = []
    for run in runs:
        if run is None:
            continue
        recs = []
        for c in store.cells(run["run_id"]):
            rec = {k: None for k in RECORD_KEYS}
            rec.update(c["record"])
            rec.update(run_id=run["run_id"], run_name=run["name"], status=c["status"])
            if rec["status"] != "ok":
                for k in SPEED_KEYS:
                    rec[k] = None
            recs.append(rec)
        out += apply_baseline(recs, baseline or run["spec"].get("baseline"))
    return out


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
    for path, fill in ((json_path, lambda r, f: _fill_json(r, f, runs or [])), (csv_path, _fill_csv)):
        if path:
            with writing(path, recs):
                _refuse_sqlite(Path(path))  # again at write time: Python callers skip check_paths
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
                run = store.find_run(run_id)
                if run is not None and run["run_id"] == run_id:
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
    takes no new file (check_output allows it), is written in place."""
    try:
        special = not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        special = False
    mode, newline = ("b", None) if binary else ("", "")
    if special:  # by the path given: /dev/stdout on a pipe resolves to '/proc/PID/fd/pipe:[N]', a name not there
        with open(_open_special(path), "w" + mode, newline=newline) as f:
            yield f
        return
    target = Path(os.path.realpath(path))
    # A short name of its own: the target's name plus a suffix could pass the file system's longest name.
    tmp = target.with_name(f".transbench-{uuid.uuid4().hex[:12]}.tmp")
    try:
        f = open(tmp, "x" + mode, newline=newline)  # the mode `open(path, "w")` gives (umask), never a shared name
    except PermissionError:
        with open(path, "w" + mode, newline=newline) as f:
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


def save_figure(fig, path: str | Path, **kwargs) -> None:
    """A matplotlib figure saved as the PNG `path` whole, or `path` as it was (replacing): savefig on the path itself
    wrote in place, so a full disk or a Ctrl-C while drawing left a truncated plot where the last report's was."""
    with replacing(path, binary=True) as f:
        fig.savefig(f, format="png", **kwargs)


def _fill_json(recs: list[dict], f, runs: list[dict]) -> None:
    from .schema import record_document

    json.dump(record_document(recs, runs, columns(recs)), f, indent=1, default=str)


def _fill_csv(recs: list[dict], f) -> None:
    cols = columns(recs)
    w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for r in recs:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in cols})


# --- output paths ------------------------------------------------------------------------------------------
# Every file a command writes besides the store (--json, --csv, --plot, `runs --out`, the report's files) is
# checked here before any work starts (a sweep can take hours), and written inside `writing`, so bad input is
# one line (SpecError) and nothing that is not ours is overwritten.

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
        check_output(path, option, db, image=option == "--plot")
    options = list(given)
    for i, option in enumerate(options):
        for other in options[:i]:
            if _same_file(Path(given[option]), Path(given[other])):
                raise SpecError(f"{other} and {option} both write {given[option]}: give them different files")


def check_output(path: str, option: str, db: str | None = None, *, image: bool = False) -> None:
    """One file a command will write: not empty, not the store `db` (nor its journal), not a folder, in a
    folder that exists and is writable, never over a SQLite database, and with `image` a format matplotlib
    writes (by the suffix). An existing other file is overwritten, as re-running a command expects. Nothing
    is created here."""
    if not str(path).strip():  # `--json ' '` wrote a file named ' ' (api.py's _path refuses it too)
        raise SpecError(f"{option} is empty: give a file path")
    with writing(path):  # a name too long, a symlink loop: one line too
        _check_file(Path(path), option, db, image)


def _check_file(p: Path, option: str, db: str | None, image: bool) -> None:
    path = str(p)
    if db and _is_store(p, Path(db)):
        raise SpecError(f"cannot write {path}: it is the store (--db); writing there would overwrite every "
                        "stored run: give another file")
    if p.is_symlink() and not p.exists() and Path(os.path.realpath(p)).is_symlink():
        raise SpecError(f"cannot write {path}: it is a symbolic link in a loop: give another file")
    if p.is_dir():
        raise SpecError(f"cannot write {path}: it is a folder; give a file path such as "
                        f"{p / EXAMPLE_NAME.get(option, 'out.txt')}")
    folder = p.parent
    if not folder.is_dir():
        why = "is not a folder" if folder.exists() else "does not exist (create it first)"
        raise SpecError(f"cannot write {path}: folder {folder} {why}")
    # An existing file needs only itself writable (e.g. /dev/stdout); a new one needs its folder.
    if not (os.access(p, os.W_OK) if p.exists() else os.access(folder, os.W_OK | os.X_OK)):
        raise SpecError(f"cannot write {path}: {'the file' if p.exists() else f'folder {folder}'} is not "
                        "writable (choose another path)")
    _refuse_sqlite(p)
    if image:
        _check_image_format(p, option)


def _is_store(p: Path, db: Path) -> bool:
    """`p` is the store or one of the files SQLite keeps beside it (overwriting those corrupts it too)."""
    return any(_same_file(p, Path(f"{db}{tail}")) for tail in ("", "-wal", "-shm", "-journal"))


def _same_file(a: Path, b: Path) -> bool:
    """Also through a symbolic or a hard link."""
    try:
        return os.path.samefile(a, b) if a.exists() and b.exists() else a.resolve() == b.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        return False


def _refuse_sqlite(p: Path) -> None:
    if is_sqlite(p):
        raise SpecError(f"cannot write {p}: it is a SQLite database (a store?), left as it is: give another file")


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


def check_folder(path: str | Path, option: str, names: tuple[str, ...] = ()) -> Path:
    """A folder a command writes files into (`report --out`), created when missing: not empty, not a file,
    really writable (a file is made and removed: permissions do not stop root, and /proc takes no files), and
    no existing file matching the glob patterns `names` (what will be overwritten) a SQLite database."""
    if not str(path).strip():  # `--out ' '` made a folder named ' '
        raise SpecError(f"{option} is empty: give a folder")
    out = Path(path)
    # One level at a time, so that a refused folder leaves none of those made for it: `--out new/NAME` with a NAME
    # too long made `new` before failing (mkdir(parents=True)), and pathlib's exists() raised for a NAME too long
    # before Python 3.13 (a traceback).
    made: list[Path] = []
    made_all = False
    try:
        if out.exists() and not out.is_dir():
            raise SpecError(f"{option} {out} is a file: give a folder")
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
    for pattern in names:
        for f in sorted(out.glob(pattern)):
            _refuse_sqlite(f)
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
