"""The HTTP client's own ceiling: `serve --url` against an endpoint that does no work (a Starlette app answering
/v1/embeddings at once with a fixed vector, under uvicorn in its own process), at Poisson rates and by the max-rate
search. What it reaches here bounds what `serve --url` can say of any server on this host; where a model server's
figures stop at the same rate, the client, not the server, is the limit (benchmarks/results/http_serving_h200_2026-11.md).
    PYTHONPATH=src python3 benchmarks/http_client_ceiling.py DB [RATES]   (RATES default 1000,2000,4000,8000;
    needs transbench[server]: it runs `python -m transbench serve`);
    then PYTHONPATH=src python3 benchmarks/print_serve.py DB"""

import os
import subprocess
import sys
import time

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

VECTOR = [0.125] * 8


async def embeddings(request):
    body = await request.json()
    texts = body.get("input") or [""]
    texts = texts if isinstance(texts, list) else [texts]
    tokens = sum(len(str(t).split()) for t in texts)
    return JSONResponse({"object": "list", "model": "stub", "data": [
        {"object": "embedding", "index": i, "embedding": VECTOR} for i in range(len(texts))],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


async def models(request):
    return JSONResponse({"object": "list", "data": [{"id": "stub", "object": "model"}]})


async def health(request):
    return JSONResponse({"status": "ok"})


app = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"]), Route("/v1/models", models),
                        Route("/health", health)])


def main(db: str, rates: str) -> int:
    import httpx

    port = int(os.environ.get("PORT", "18472"))
    url = f"http://127.0.0.1:{port}"
    here = os.path.dirname(os.path.abspath(__file__))
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "--app-dir", here, "--host", "127.0.0.1", "--port",
                               str(port), "--log-level", "warning", "http_client_ceiling:app"])
    try:
        for _ in range(200):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            print("the stub server did not come up")
            return 1
        tb = [sys.executable, "-m", "transbench", "serve", "--url", url, "--api", "openai-embeddings",
              "--lengths", "lognormal:64:256", "--db", db]
        subprocess.run(tb + ["--rate", rates, "--duration", "2", "--warmup", "0.5", "--slo-ms", "20",
                             "--name", "http-stub-rates"], check=False)
        subprocess.run(tb + ["--find-max-rate", "--slo-ms", "20", "--duration", "1.5", "--warmup", "0.5",
                             "--timeout", "300", "--name", "http-stub-max"], check=False)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "1000,2000,4000,8000"))
