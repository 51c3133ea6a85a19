"""`transbench server`: an OpenAI-compatible HTTP server over one model and backend."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from .. import api
from ..errors import SpecError
from ..scenarios.serve.server_spec import ServerSpec
from ..spec import split_list
from .app import app, fail
from .tables import visible


def help_of(name: str) -> str:
    """An option's help, declared once with its ServerSpec field."""
    return ServerSpec.__dataclass_fields__[name].metadata["help"]


@app.command()
def server(
    model: str = typer.Option(ServerSpec.model, "--model", "-m", help=help_of("model")),
    backend: str = typer.Option(ServerSpec.backend, "--backend", "-b", help=help_of("backend")),
    dtype: Optional[str] = typer.Option(None, help=help_of("dtype")),
    device: str = typer.Option(ServerSpec.device, help=help_of("device")),
    host: str = typer.Option(ServerSpec.host, help=help_of("host")),
    port: int = typer.Option(ServerSpec.port, help=help_of("port")),
    served_model_name: Optional[str] = typer.Option(None, help=help_of("served_model_name")),
    max_batch_size: int = typer.Option(ServerSpec.max_batch_size, help=help_of("max_batch_size")),
    max_wait_ms: float = typer.Option(ServerSpec.max_wait_ms, help=help_of("max_wait_ms")),
    max_length: Optional[int] = typer.Option(None, help=help_of("max_length")),
    max_tokens: int = typer.Option(ServerSpec.max_tokens, help=help_of("max_tokens")),
    warm_lengths: Optional[str] = typer.Option(None, help=help_of("warm_lengths") + " (comma-separated)"),
    seed: int = typer.Option(ServerSpec.seed, help=help_of("seed")),
) -> None:
    """Serve a model over HTTP (OpenAI-compatible: /v1/embeddings or /v1/completions, /health, /metrics)."""
    def ready(info: dict) -> None:
        typer.echo(visible(f"transbench server: {info['model']} ({info['backend']} {info['dtype']}) on {info['url']}"
                           f"{info['endpoint']}, prepared in {info.get('prepare_s', 0):.1f} s; tokenizer "
                           f"{info['tokenizer']}; /health, /metrics; Ctrl-C or SIGTERM stops it"), err=True)

    try:
        warm = split_list(warm_lengths, int) if warm_lengths is not None else []
        if warm_lengths is not None and not warm:
            raise SpecError("--warm-lengths is empty: give prompt lengths (8,64) or leave it out")
        spec = ServerSpec(model=model, backend=backend, dtype=dtype, device=device, host=host, port=port,
                          served_model_name=served_model_name, max_batch_size=max_batch_size,
                          max_wait_ms=max_wait_ms, max_length=max_length, max_tokens=max_tokens,
                          warm_lengths=warm, seed=seed)
        ended = api.server(spec, on_ready=ready)
    except SpecError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        typer.echo("server stopped (interrupted)", err=True)
        sys.exit(130)
    typer.echo(f"server stopped ({ended or 'done'}): requests in flight were answered", err=True)
