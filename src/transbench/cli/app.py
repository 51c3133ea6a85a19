"""The shared typer app and the one way a command reports bad input (one line, exit code 2)."""

from __future__ import annotations

import functools
import inspect
import os
import signal
import sys
import threading
import typing

import typer

from ..boundary import shortened
from ..errors import SpecError
from ..declare import CommandOptions, declared, option_of
from .options import ALIASES, OPTIONAL_VALUE, App, parameter, read
from .tables import visible

app = App(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="How fast transformer models really run on your GPU, and where the time goes.")


def version() -> str:
    """The installed distribution's version; a source tree run without installing has only __version__."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("transbench")
    except PackageNotFoundError:
        from .. import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"transbench {version()}")
        raise typer.Exit()


@app.callback()
def _options(show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                               help="print the version and exit")) -> None:
    pass


def fail(message: str, code: int = 2) -> None:
    # One line, literally: a control character from user input (a model path, a name) is shown escaped, and a value
    # of 100,000 characters cut (boundary.shortened; after the escapes, which lengthen it).
    typer.echo(f"error: {shortened(visible(message))}", err=True)
    raise typer.Exit(code)


def stdout_to_devnull() -> None:
    """Point fd 1 at /dev/null after stdout failed (a reader gone, a full disk): the interpreter's last flush of what
    stays buffered would fail again ('Exception ignored ... BrokenPipeError', exit 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


class Stopped(KeyboardInterrupt):
    """A SIGTERM or SIGHUP, raised where the command is, so it ends as Ctrl-C does."""


def _stopped(signum, frame) -> None:
    raise Stopped(signum)


# Signals that end a process by default and are ended as Ctrl-C instead: SIGTERM (`kill PID`, `timeout`, a batch
# scheduler) and SIGHUP (the terminal or ssh session that started the command closed; `nohup` sets it ignored,
# which is kept).
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


def _catch_stop_signals() -> list:
    """SIGTERM or SIGHUP ended the process where it stood: exit -15 (-1) with no word, the cell's worker left running
    it (a hung one for ever; runner/worker.py), a launched cell's folder and a worker's log left in the temporary
    folder. Raised as an interruption instead, each runs the cleanup Ctrl-C runs. Only where the signal has its
    default action: a process that set its own (or ignores it) keeps it. Returns the signals caught."""
    caught = []
    for sig in STOP_SIGNALS:
        try:
            if signal.getsignal(sig) is not signal.SIG_DFL:
                continue
            signal.signal(sig, _stopped)
        except ValueError:  # not the main thread: signals cannot be caught here
            break
        caught.append(sig)
    return caught


def _redelivering(previous):
    """An unraisable-exception hook that sends an interruption again. A signal's exception raised while a finalizer
    ran (an asyncio transport's __del__ as `serve --url` closed its connection check) is printed by Python as
    "Exception ignored in ..." with its traceback, and dropped: Ctrl-C was lost, and the run went on to the end,
    exit 0. The signal comes again a moment later, after the finalizer, where the command can end as it should."""

    def hook(unraisable) -> None:
        exc = unraisable.exc_value
        if not isinstance(exc, KeyboardInterrupt):
            return previous(unraisable)
        signum = exc.args[0] if isinstance(exc, Stopped) else signal.SIGINT
        # Not from here: a signal sent inside the hook would be raised inside it and dropped again.
        again = threading.Timer(0.01, os.kill, (os.getpid(), signum))
        again.daemon = True
        again.start()

    return hook


def friendly(fn, measures: bool = False):
    """Turn bad input into one line on stderr and exit code 2, never a stack trace; Ctrl-C, SIGTERM and SIGHUP into
    one line and exit code 128 + the signal's number, after the cleanup (workers ended, temporary files removed).
    `measures`: the command stores cells, and the line says how to resume them; a reader (`report`, `runs`, `merge`,
    ...) told to "rerun the same command with the same --name to resume" had no --name and nothing to resume."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        caught = _catch_stop_signals()
        unraisable, sys.unraisablehook = sys.unraisablehook, _redelivering(sys.unraisablehook)
        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            fail(str(exc))
        except KeyboardInterrupt as exc:
            signum = exc.args[0] if isinstance(exc, Stopped) else signal.SIGINT
            how = "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
            # A run started without --name has one of its own: `transbench runs` lists it (and `run --resume` takes
            # the newest), and rerunning with it resumes.
            typer.echo(f"{how}: finished cells are in the store; rerun the same command with the same --name to "
                       "resume (a run started without one: `transbench runs` lists its name)" if measures else how,
                       err=True)
            sys.exit(128 + signum)
        finally:
            sys.unraisablehook = unraisable
            for sig in caught:
                signal.signal(sig, signal.SIG_DFL)

    return wrapper


def declared_command(app, cls, *, name: str | None = None, skip: tuple[str, ...] = (),
                     command_options: tuple[str, ...] = ()):
    """Register `fn(given, **command_options)` as a command whose options are generated from the settings of
    `cls` (declare.py), less `skip`, plus the declared CommandOptions named in `command_options` and any option
    `fn` declares itself after `given`. `given` maps each setting's field to its value, None where not given."""
    def register(fn):
        hints = typing.get_type_hints(fn)
        own = [p.replace(annotation=hints.get(p.name, p.annotation))
               for p in list(inspect.signature(fn).parameters.values())[1:] if p.name not in command_options]
        settings = [(f, s) for f, s in declared(cls) if s.cli and f.name not in skip]
        common = {f.name: (f, s) for f, s in declared(CommandOptions)}
        params = [parameter(cls, f, s) for f, s in settings]
        params += [parameter(CommandOptions, *common[c], default_none=False) for c in command_options]
        params += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own]
        for f, s in settings:
            ALIASES.update({a: option_of(f, s) for a in s.aliases if a.startswith("-")})
            if s.bare is not None:
                OPTIONAL_VALUE[option_of(f, s)] = s.bare

        def command(**kwargs):
            given = {f.name: read(cls, f.name, kwargs.pop(f.name)) for f, _ in settings}
            return fn(given, **kwargs)

        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.__doc__ = fn.__doc__
        command.__name__ = fn.__name__
        app.command(name or fn.__name__.replace("_", "-"))(friendly(command, measures=True))
        return fn

    return register
