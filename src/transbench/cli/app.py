"""The shared typer app and the one way a command reports bad input (one line, exit code 2)."""

from __future__ import annotations

import functools
import sys

import typer

from ..errors import SpecError
from .options import App
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
    # One line, literally: a control character from user input (a model path, a name) is shown escaped.
    typer.echo(f"error: {visible(message)}", err=True)
    raise typer.Exit(code)


def friendly(fn):
    """Turn bad input into one line on stderr and exit code 2, never a stack trace."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            fail(str(exc))
        except KeyboardInterrupt:
            typer.echo("interrupted: finished cells are in the store; rerun with the same --name to resume",
                       err=True)
            sys.exit(130)

    return wrapper
