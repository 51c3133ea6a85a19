#!/usr/bin/env bash
# What HTTP costs: bert-base embeddings and gpt2 streamed completions behind `transbench server` (sdpa and
# fused, fp16), measured by `serve --url` on loopback, against in-process `serve` at the same loads: p50/p99 at two
# Poisson rates, the largest rate meeting a p99 target (offline probe + bisection), and the client's send lag.
# Run from the repo root on a GPU machine (needs transbench[server]: starlette, uvicorn, httpx):
#   bash benchmarks/http_serving.sh [DB] [PARTS]
# PARTS (default bert,gpt2), comma-separated: bert and gpt2 run two Poisson rates through sdpa and fused on both
# paths (a few minutes each); max-bert-fused, max-bert-sdpa, max-gpt2-fused, ... run the max-rate search (offline
# probe + bisection, p99 <= the SLO) on both paths for one backend (2-4 min each: the in-process fused probes
# capture their graphs anew). Parts of one DB may run in separate calls; each ends printing one row per cell
# (benchmarks/print_serve.py). Then: transbench report DB.
set -u
DB=${1:-http.db}
PARTS=${2:-bert,gpt2}
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TRANSBENCH_CACHE_DIR=${TRANSBENCH_CACHE_DIR:-$(dirname "$DB")/engine-tuning}
TB="python3 -m transbench"
PORT=${PORT:-18471}
URL=http://127.0.0.1:$PORT
OUT=$(dirname "$DB")
SERVER=
# INPROC=0 skips the in-process cells. Overridable for a CPU smoke run: DTYPE=fp32 BERT=bert-tiny GPT2=gpt2-tiny BACKENDS=sdpa BERT_RATES=20,50 ...
DTYPE=${DTYPE:-fp16}
BERT=${BERT:-bert-base-uncased}
GPT2=${GPT2:-gpt2}
BACKENDS=${BACKENDS:-sdpa fused}
BERT_LEN=${BERT_LEN:-256}
BERT_RATES=${BERT_RATES:-1000,3000}
GPT2_RATES=${GPT2_RATES:-20,80}

start_server() {  # transbench server args...; waits for /health (the backend is prepared before it listens)
  $TB server --port "$PORT" "$@" 2> "$OUT/server-$PORT.log" &
  SERVER=$!
  python3 - "$URL" "$SERVER" <<'EOF' || { echo "server did not come up:"; cat "$OUT/server-$PORT.log"; return 1; }
import os, sys, time
import httpx
url, pid = sys.argv[1], int(sys.argv[2])
for _ in range(1200):
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(1)
    try:
        if httpx.get(url + "/health", timeout=1).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.25)
sys.exit(1)
EOF
  cat "$OUT/server-$PORT.log"
}

stop_server() {  # SIGTERM: a clean stop (requests in flight answered); its /metrics first, for the log
  python3 -c "import httpx,sys; t=httpx.get(sys.argv[1]+'/metrics').text; print('\n'.join(l for l in t.splitlines() if l.startswith(('transbench_batch_size_sum','transbench_batch_size_count','transbench_requests_total','transbench_batch_seconds_sum','transbench_batch_seconds_count'))))" "$URL"
  kill -TERM "$SERVER" && wait "$SERVER"
  echo "server exit code $?"
  tail -1 "$OUT/server-$PORT.log"
}

# One model and backend through both paths: in-process first, then the same loads through the server.
#   rates: Poisson rates (p50/p99, error rate, client lag); with MAX=1 instead the largest rate whose p99 meets SLO.
pair() {  # label, backend, rates, slo, in-process args (quoted), server args (quoted), client args (quoted)
  local label=$1 b=$2 rates=$3 slo=$4 inproc=$5 srv=$6 client=$7
  local load name
  if [[ ${MAX:-0} == 1 ]]; then
    load="--duration 1.5 --warmup 0.5 --timeout 300 --find-max-rate --slo-ms $slo"; name=$label-$b-max
  else
    load="--duration 2 --warmup 0.5 --timeout 300 --rate $rates --slo-ms $slo"; name=$label-$b
  fi
  if [[ ${INPROC:-1} == 1 ]]; then  # INPROC=0: the HTTP path only (its in-process cells measured in an earlier call)
    # shellcheck disable=SC2086
    $TB serve $inproc --backend "$b" --dtype "$DTYPE" $load --name "inproc-$name" --db "$DB"
  fi
  # shellcheck disable=SC2086
  start_server $srv --backend "$b" --dtype "$DTYPE" || return 1
  # shellcheck disable=SC2086
  $TB serve --url "$URL" $client $load --name "http-$name" --db "$DB"
  stop_server
}

bert() {  # backend. Embeddings: in-process runs the base model (last hidden state), as the server does before pooling.
  pair bert "$1" "$BERT_RATES" 20 "--model $BERT --task base --lengths lognormal:64:$BERT_LEN" \
    "--model $BERT --max-length $BERT_LEN" "--api openai-embeddings --lengths lognormal:64:$BERT_LEN"
}

gpt2() {  # backend. Completions of one prompt length (the server batches prompts of one length together: its
  # generators take no padding mask), 32 greedy tokens streamed one an event; in-process latency is to the last token.
  pair gpt2 "$1" "$GPT2_RATES" 1500 "--model $GPT2 --task generate --lengths fixed:64 --new-tokens 32" \
    "--model $GPT2 --max-tokens 32 --warm-lengths 64" "--api openai-completions --lengths fixed:64 --new-tokens 32"
}

python3 -c "import importlib.util as u; print('uvicorn with', ', '.join(m for m in ('uvloop', 'httptools') if u.find_spec(m)) or 'asyncio and h11 (pip install uvloop httptools: faster)')"
nvidia-smi 2>/dev/null --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true
for part in ${PARTS//,/ }; do
  case $part in
    bert|gpt2) for b in $BACKENDS; do $part "$b"; done ;;
    max-bert-*|max-gpt2-*) m=${part#max-}; MAX=1 ${m%%-*} "${m#*-}" ;;
    *) echo "unknown part $part: bert, gpt2, max-bert-BACKEND, max-gpt2-BACKEND"; exit 2 ;;
  esac
done
python3 benchmarks/print_serve.py "$DB"
