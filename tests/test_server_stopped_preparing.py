"""`transbench server` stopped by SIGTERM or SIGHUP while it prepares says which signal, and exits 128 + it."""

from __future__ import annotations

import signal

import pytest
from test_cli_input import invoke

from transbench.cli import server as server_cli
from transbench.cli.app import Stopped


@pytest.mark.parametrize("exc, code, line", [(Stopped(signal.SIGTERM), 143, "server stopped (SIGTERM)"),
                                             (Stopped(signal.SIGHUP), 129, "server stopped (SIGHUP)"),
                                             (KeyboardInterrupt(), 130, "server stopped (interrupted)")])
def test_a_signal_while_the_server_prepares_is_named(monkeypatch, exc, code, line):
    def preparing(spec, on_ready=None):
        raise exc  # what cli/app.py raises for SIGTERM or SIGHUP before the server takes the signals itself

    monkeypatch.setattr(server_cli.api, "server", preparing)
    res = invoke("server", "--model", "bert-tiny", "--backend", "sdpa", "--device", "cpu", "--port", "18999")
    # SIGTERM was "server stopped (interrupted)", exit 130, as if Ctrl-C had been pressed.
    assert res.exit_code == code and res.stderr.strip() == line
