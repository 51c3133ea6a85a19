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

    with pytest.raises(SystemExit) as ended:
        command()
    assert ended.value.code == 128 + signum
    err = capsys.readouterr().err
    assert "Exception ignored" not in err and "Traceback" not in err
    assert "finished cells are in the store" in err
