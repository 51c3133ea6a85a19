"""`transbench server`: an OpenAI-compatible HTTP server over one model and backend."""

from __future__ import annotations

import signal
import sys
import typer

from .. import api
from ..errors import SpecError
from ..scenarios.serve.server_spec import ServerSpec
from .app import Stopped, app, declared_command, fail
from .options import build_spec
from .tables import visible


def left(info: dict) -> str:
    """What --prepare-budget left: batches of those shapes pad into larger prepared ones (a backend with a graph per
    shape), or are prepared on first use (eager, sdpa: nothing to capture)."""
    if not info.get("shapes_left"):
        return ""
    return (f" ({info['shapes_prepared']} shapes; {info['shapes_left']} left to pad into larger ones, or to prepare "
            "on first use where the backend has no graph per shape)")


@declared_command(app, ServerSpec)
def server(given: dict) -> None:
    """Serve a model over HTTP (OpenAI-compatible: /v1/embeddings or /v1/completions, /health, /metrics)."""
    def ready(info: dict) -> None:
        typer.echo(visible(f"transbench server: {info['model']} ({info['backend']} {info['dtype']}) on {info['url']}"
                           f"{info['endpoint']}, prepared in {info.get('prepare_s', 0):.1f} s{left(info)}; tokenizer "
                           f"{info['tokenizer']}; /health, /metrics; Ctrl-C or SIGTERM stops it"), err=True)

    def preparing(seconds: float) -> None:
        # A fused server's first start on a machine compiles its kernels before it listens: minutes in which
        # nothing was printed (tests/gpu/test_server_gpu.py HEALTH_S). Said once preparing has run a while, so that
        # a refusal found at once stays one line.
        typer.echo(f"transbench server: still preparing after {seconds:.0f} s (loading, the fp32 check, shapes; a "
                   "first start also compiles kernels)", err=True)

    try:
        if given["warm_lengths"] == []:
            raise SpecError("--warm-lengths is empty: give prompt lengths (8,64) or leave it out")
        spec = build_spec(ServerSpec, None, given)
        ended = api.server(spec, on_ready=ready, on_preparing=preparing)
    except SpecError as exc:
        fail(str(exc))
    except KeyboardInterrupt as exc:
        # Before the server takes SIGTERM itself (while it prepares), a SIGTERM or SIGHUP arrives as Stopped
        # (cli/app.py): it was "server stopped (interrupted)", exit 130, as if Ctrl-C had been pressed.
        signum = exc.args[0] if isinstance(exc, Stopped) else signal.SIGINT
        how = "interrupted" if signum == signal.SIGINT else signal.Signals(signum).name
        typer.echo(f"server stopped ({how})", err=True)
        sys.exit(128 + signum)
    cut = getattr(ended, "cut", 0)
    said = (f"{cut} request(s) still in flight when the grace ran out were cut off" if cut
            else "requests in flight were answered")
    typer.echo(f"server stopped ({ended or 'done'}): {said}", err=True)
