"""Ctrl-C while the command's modules load ends it with one word and exit 130, not an import's traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Ctrl-C lands as the run command's module is imported: the first half second of every command.
START = """
import sys

class Interrupting:
    def find_spec(self, name, path=None, target=None):
        if name == "transbench.cli.run":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, Interrupting())
sys.argv = ["transbench", "runs"]
from transbench.cli import main
main()
"""


def test_ctrl_c_while_the_commands_load_is_one_word():
    done = subprocess.run([sys.executable, "-c", START], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 130, done.stderr
    assert done.stderr == "interrupted\n"
