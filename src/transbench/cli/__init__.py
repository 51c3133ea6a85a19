"""The `transbench` command: a typer app whose commands live in this package, one module per topic."""

from __future__ import annotations

import errno
import importlib
import os
import sys

# The command never reaches a hub (models come from presets or folders, which the library reads with
# local_files_only): set before anything imports huggingface_hub, which reads it once. Only here, in the
# process the command owns; the Python API leaves its caller's environment alone.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    from .app import app, fail  # noqa: E402,F401

    # Each module registers its commands on `app`; a topic whose module is not there yet is left out.
    for _topic in ("run", "serve", "server", "info", "models", "micro", "train", "report", "demo", "tune"):
        try:
            importlib.import_module(f"{__name__}.{_topic}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{_topic}":
                raise
except KeyboardInterrupt:
    # Ctrl-C while the commands load (the first half second of every command) was Python's traceback of an import,
    # exit -2. Nothing has started: one word and 130, as an interrupted command ends (cli/app.py friendly).
    sys.stderr.write("interrupted\n")
    sys.exit(130)


# Where stdout can fail for reasons of its own: the reader went away (`| head`), the disk or quota is full
# (`> /full/disk/file`, /dev/full), an I/O error on the device.
_OUTPUT_ERRORS = {errno.EPIPE, errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def _streams() -> None:
    """Text a terminal's encoding cannot show (a run named in Japanese under PYTHONIOENCODING=ascii or a C
    locale) is printed as escapes, not a UnicodeEncodeError traceback."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):  # not a text file of io's (a test runner's capture)
            pass


def _output_failed(exc: OSError) -> int:
    """One line for stdout that cannot be written, and fd 1 pointed at /dev/null so the interpreter's last flush
    of what stays buffered does not fail again ('Exception ignored ... BrokenPipeError', exit 120)."""
    from .app import stdout_to_devnull

    stdout_to_devnull()
    if exc.errno != errno.EPIPE:  # a reader that went away asked for no more: no word (as `yes | head`), exit 1
        try:
            sys.stderr.write(f"error: cannot write the output ({exc.strerror or exc}): free some space or write "
                             "it elsewhere; finished cells are in the store\n")
            sys.stderr.flush()
        except OSError:
            pass
    return 1


def main() -> None:
    _streams()
    code = 0
    try:
        try:
            app()
        except SystemExit as exc:
            code = exc.code
        sys.stdout.flush()  # here, not at exit: a full disk is seen while it can still be said
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRORS:
            raise
        code = _output_failed(exc)
    sys.exit(code)
