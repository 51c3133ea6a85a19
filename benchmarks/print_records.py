"""One line per record of a `transbench run --json` file, for the GPU script's logs:
    python3 benchmarks/print_records.py RECORDS.json LABEL"""

import json
import signal
import sys

KEYS = ("run_name", "model", "dtype", "quant", "status", "latency_ms", "throughput_per_s", "rel_err", "task_agreement", "host_ms",
        "peak_mem_mb", "sm_clock_mhz", "busy_cores", "decode_ms_per_token", "decode_hbm_share")

if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly, as it does a shell tool
    path, label = sys.argv[1], " ".join(sys.argv[2:])
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:  # a step cut by its timeout writes no JSON: its log says what it finished
        sys.exit(f"{label} no records in {path}: {exc}")
    for r in data["cells"] if isinstance(data, dict) else data:  # the versioned record, or an older bare list
        print(label, r.get("backend"), r.get("batch_size"), r.get("seq_len"),
              " ".join(f"{k} {r.get(k)}" for k in KEYS))
