"""`transbench server` stopped by SIGTERM or SIGHUP while it prepares says which signal, and exits 128 + it."""

from __future__ import annotations

import signal
import socket

import pytest
from test_cli_input import invoke

from transbench.cli import server as server_cli
from transbench.cli.app import Stopped


@pytest.mark.parametrize("exc, code, line", [(Stopped(signal.SIGTERM), 143, "server stopped (SIGTERM)"),
                                             (Stopped(signal.SIGHUP), 129, "server stopped (SIGHUP)"),
                                             (KeyboardInterrupt(), 130, "server stopped (interrupted)")])
def test_a_signal_while_the_server_prepares_is_named(monkeypatch, exc, code, line):
    def preparing(spec, **callbacks):
        raise exc  # what cli/app.py raises for SIGTERM or SIGHUP before the server takes the signals itself

    monkeypatch.setattr(server_cli.api, "server", preparing)
    res = invoke("server", "--model", "bert-tiny", "--backend", "sdpa", "--device", "cpu", "--port", "18999")
    # SIGTERM was "server stopped (interrupted)", exit 130, as if Ctrl-C had been pressed.
    assert res.exit_code == code and res.stderr.strip() == line


def failing_model_process(after_s: float, failure: str, first=lambda: None):
    """A stand-in for the server's model process whose preparing fails after `after_s`, calling `first` before."""
    import threading

    class Failing:
        def __init__(self, *args):
            self.ready, self.failure = threading.Event(), None

        def start(self):
            def fail():
                first()
                self.failure = failure
                self.ready.set()
            threading.Timer(after_s, fail).start()

        def stop(self, timeout):
            pass

    return Failing


def test_a_server_preparing_a_while_says_so_once_and_a_refusal_after_it_is_its_own_line(monkeypatch):
    """A fused server's first start compiles its kernels before it listens: minutes of silence, read as a hang. Past
    PREPARING_S it says it is still preparing, once; what it refuses after that is the line after it."""
    import types

    from transbench.scenarios.serve import server as srv

    monkeypatch.setattr(srv, "ModelProcess", failing_model_process(0.6, "its output was wrong"))
    monkeypatch.setattr(srv, "PREPARING_S", 0.2)
    monkeypatch.setattr(srv, "bind", lambda host, port: socket.socket())
    monkeypatch.setattr(server_cli.api, "server", lambda spec, on_ready, on_preparing: srv.run(
        types.SimpleNamespace(backend="sdpa", dtype="fp32", host="127.0.0.1", port=18999), types.SimpleNamespace(
            name="bert-tiny", path=None, shape=types.SimpleNamespace(vocab=100)), False, on_ready, on_preparing))
    res = invoke("server", "--model", "bert-tiny", "--backend", "sdpa", "--device", "cpu", "--port", "18999")
    first, second = res.stderr.strip().splitlines()
    assert res.exit_code == 2
    assert first.startswith("transbench server: still preparing after 0 s (") and "compiles kernels" in first
    assert second == "error: sdpa fp32 could not be prepared for bert-tiny: its output was wrong"


def test_the_port_is_held_from_its_check_through_the_preparing(monkeypatch):
    """The port was checked free, then bound again once the backend was ready: another process that took it in
    between (a test beside others did) left a server that said it was ready on that port, then failed to bind it,
    exit 3. The socket bound at the check is the one the server listens on, so nothing can take the port meanwhile."""
    import errno
    import types

    from transbench.scenarios.serve import server as srv

    with socket.socket() as probe:  # a port free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    taken: list = []

    def try_port():  # while the model process prepares, another process tries the port its server holds
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", port))
                taken.append(None)
            except OSError as exc:
                taken.append(exc.errno)

    monkeypatch.setattr(srv, "ModelProcess", failing_model_process(0.2, "stopped by the test", try_port))
    with pytest.raises(srv.SpecError, match="stopped by the test"):
        srv.run(types.SimpleNamespace(backend="sdpa", dtype="fp32", host="127.0.0.1", port=port), types.SimpleNamespace(
            name="bert-tiny", path=None, shape=types.SimpleNamespace(vocab=100)), False)
    assert taken == [errno.EADDRINUSE]
    with socket.socket() as again:  # and given back when the server ends
        again.bind(("127.0.0.1", port))
