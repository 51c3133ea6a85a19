"""CPU seconds `transbench server`'s HTTP process spends per embeddings request: on a GPU host that process, not the
model, bounds the server's rate (benchmarks/results/http_serving_h200_2026-11.md). A bert-tiny server on the CPU
is driven by `serve --url` at a fixed rate; the HTTP process's user + system time (/proc, Linux) over the load is
divided by the requests it answered (its /metrics). The model runs in a child process, not counted.

  PYTHONPATH=src python benchmarks/studies/server_request_cpu.py [--rate 600] [--runs 2]

Needs transbench[server]. Prints one line per run: CPU seconds, requests, ms per request, the client's achieved rate.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as r:
        return r.read().decode()


def one(rate: float, duration: float) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-m", "transbench", "server", "--model", "bert-tiny", "--device", "cpu",
                               "--dtype", "fp32", "--port", str(port), "--max-length", "128"],
                              stderr=subprocess.DEVNULL, env=env)
    try:
        for _ in range(600):
            try:
                get(url + "/health")
                break
            except OSError:
                time.sleep(0.2)
        before = cpu_s(server.pid)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "transbench", "serve", "--url", url, "--api", "openai-embeddings",
                            "--lengths", "lognormal:32:128", "--rate", str(rate), "--duration", str(duration),
                            "--warmup", "0.5", "--db", f"{tmp}/s.db", "--json", f"{tmp}/s.json"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            achieved = json.loads(Path(f"{tmp}/s.json").read_text())["cells"][0]["achieved_rate"]
        spent = cpu_s(server.pid) - before
        answered = sum(int(line.rsplit(" ", 1)[1]) for line in get(url + "/metrics").splitlines()
                       if line.startswith("transbench_requests_total"))
    finally:
        server.terminate()
        server.wait(30)
    return (f"HTTP process: {spent:.2f} CPU s for {answered} requests, {spent / answered * 1e3:.3f} ms each; "
            f"client achieved {achieved:.1f}/s of {rate:g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=600.0)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    for _ in range(a.runs):
        print(one(a.rate, a.duration), flush=True)


if __name__ == "__main__":
    main()
