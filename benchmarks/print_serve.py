"""One line per serve cell of a store, in-process and HTTP side by side, for benchmarks/http_serving.sh's log:
    PYTHONPATH=src python3 benchmarks/print_serve.py DB"""

import signal
import sys

from transbench import api

KEYS = ("offered_rate", "achieved_rate", "latency_p50_ms", "latency_p99_ms", "error_rate", "ttft_p50_ms",
        "tpot_p50_ms", "client_lag_p99_ms", "client_lag_max_ms", "max_rate", "rel_err", "reference_cosine_min")


def show(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly, as it does a shell tool
    db = sys.argv[1]
    runs = [r for r in api.runs(db) if str(r.get("name", "")).startswith(("inproc-", "http-"))]
    for r in api.records(db, [r["run_id"] for r in runs]):
        print(r.get("run_name"), r.get("backend"), r.get("mode"), r.get("status"),
              " ".join(f"{k} {show(r[k])}" for k in KEYS if r.get(k) is not None), r.get("error") or "")
