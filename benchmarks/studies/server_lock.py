"""What a busy model thread costs an HTTP server in the same process: a Starlette app on uvicorn answering a small
JSON body beside a thread that spends a share of every 10 ms in Python (as `transbench server`'s model thread does
while it launches a transformers forward), driven by a keep-alive asyncio client in another process. On Linux the
server and the client are pinned to one core each (the first two this process may use).

  PYTHONPATH=src python benchmarks/studies/server_lock.py                  # the table of results/http_serving_*
  PYTHONPATH=src python benchmarks/studies/server_lock.py --busy 0.9 --switch 0.0005 --requests 5000

Needs starlette and uvicorn (pip install -e '.[server]'). Prints one line per setting: requests/s.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

SERVER = r'''
import os, sys, threading, time
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
import uvicorn

busy, switch, port = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
sys.setswitchinterval(switch)

def model():
    while True:
        t = time.perf_counter()
        while time.perf_counter() - t < 0.010 * busy:
            pass
        time.sleep(0.010 * (1 - busy))

async def answer(request):
    await request.body()
    return JSONResponse({"data": [{"embedding": [0.0] * 8}]})

if busy > 0:
    threading.Thread(target=model, daemon=True).start()
uvicorn.run(Starlette(routes=[Route("/v1/e", answer, methods=["POST"])]), host="127.0.0.1", port=port,
            log_level="warning")
'''

CLIENT = r'''
import asyncio, sys, time
port, n, conc = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
REQ = (b"POST /v1/e HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n"
       b'{"input": "a b"}')

async def conn(k):
    for _ in range(100):
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            break
        except OSError:
            await asyncio.sleep(0.1)
    for _ in range(k):
        w.write(REQ)
        head = await r.readuntil(b"\r\n\r\n")
        size = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length"))
        await r.readexactly(size)
    w.close()

async def main():
    await asyncio.gather(*[conn(20) for _ in range(conc)])  # warm-up
    t = time.perf_counter()
    await asyncio.gather(*[conn(n // conc) for _ in range(conc)])
    print(f"{(n // conc) * conc / (time.perf_counter() - t):.0f}")

asyncio.run(main())
'''

SETTINGS = [(0.0, 0.005), (0.0, 0.0005), (0.5, 0.0005), (0.9, 0.0005), (0.9, 0.005)]


def pinned(cmd: list[str], core: int | None) -> list[str]:
    return ["taskset", "-c", str(core), *cmd] if core is not None else cmd


def measure(busy: float, switch: float, requests: int, conns: int, port: int) -> str:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    has_taskset = subprocess.run(["sh", "-c", "command -v taskset"], capture_output=True).returncode == 0
    server_core, client_core = (cores[0], cores[1]) if len(cores) >= 2 and has_taskset else (None, None)
    server = subprocess.Popen(pinned([sys.executable, "-c", SERVER, str(busy), str(switch), str(port)], server_core))
    try:
        time.sleep(2.0)
        out = subprocess.run(pinned([sys.executable, "-c", CLIENT, str(port), str(requests), str(conns)], client_core),
                             capture_output=True, text=True, timeout=300)
        if out.returncode:
            return f"client failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
        return out.stdout.strip()
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", type=float, help="share of each 10 ms the model thread spends in Python (0..1)")
    ap.add_argument("--switch", type=float, help="the interpreter's switch interval, seconds")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--port", type=int, default=18601)
    a = ap.parse_args()
    if (a.busy is None) != (a.switch is None):
        ap.error("give --busy and --switch together, or neither (the table)")
    if a.busy is not None and not 0 <= a.busy <= 1:
        ap.error("--busy is a share: 0..1")
    settings = SETTINGS if a.busy is None else [(a.busy, a.switch)]
    print("| Python share of the model thread | switch interval | requests/s |\n|---|---|---|")
    for busy, switch in settings:
        rate = measure(busy, switch, a.requests, a.connections, a.port)
        print(f"| {busy:.0%} | {switch * 1000:g} ms | {rate} |")


if __name__ == "__main__":
    main()
