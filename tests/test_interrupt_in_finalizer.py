"""Ctrl-C or SIGTERM that lands while a finalizer runs still ends the command (128 + the signal), never dropped."""

from __future__ import annotations

import os
import signal
import time

import pytest

from transbench.cli.app import friendly


class _Closing:
    """Stands for an asyncio transport whose __del__ runs as the signal arrives."""

    def __init__(self, signum: int):
        self.signum = signum

    def __del__(self):
        os.kill(os.getpid(), self.signum)
        time.sleep(0.05)  # the handler runs here, inside __del__: Python prints its exception and drops it


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_raised_inside_a_finalizer_still_ends_the_command(signum, capsys):
    @friendly
    def command():
        _Closing(signum)  # finalized at once
        for _ in range(200):
            time.sleep(0.01)
        return "went on to the end"

    # SIGINT as a fresh process has it (Python's handler raising KeyboardInterrupt): a test run earlier in the same
    # worker may have left another one, and the signal was then not raised at all
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(SystemExit) as ended:
            command()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ended.value.code == 128 + signum
    err = capsys.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err
    assert err.strip() == ("interrupted" if signum == signal.SIGINT else "stopped by SIGTERM")


def test_an_interrupted_reader_is_not_told_to_resume(capsys):
    """`report`, `runs`, `merge` measure nothing: no --name to give again, no cells to resume."""

    @friendly
    def reader():
        raise KeyboardInterrupt

    @friendly
    def measuring():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as ended:
        reader()
    assert ended.value.code == 130 and capsys.readouterr().err.strip() == "interrupted"
    with pytest.raises(SystemExit):
        friendly(measuring.__wrapped__, measures=True)()
    assert "rerun the same command with the same --name to resume" in capsys.readouterr().err
