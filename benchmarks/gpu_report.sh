#!/usr/bin/env bash
# A real bert-base fp16 sweep on the GPU, its report (markdown, PNGs, HTML) and a run-to-run comparison
# of two identical sdpa runs (which should come out `same`). Run from the repo root:
#     bash benchmarks/gpu_report.sh
# Writes a handful of files directly under ${OUT:-/tmp/out}; the full report stays in /tmp/gpu_report.
# Budget: about 4 minutes on an H100; each step is capped and a failing step does not stop the rest.
set -x
OUT=${OUT:-/tmp/out}
WORK=/tmp/gpu_report
DB=$WORK/report.db
export PYTHONPATH=src
mkdir -p "$OUT"
rm -rf "$WORK" && mkdir -p "$WORK"
TB="python3 -m transbench"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv || true

# The backends this checkout has (compile, cudagraph and fused come from other modules).
AVAILABLE=$(python3 -c "
from transbench import backends
reg = backends.registry()
print(','.join(b for b in ('eager', 'sdpa', 'sdpa-flash', 'cudagraph', 'fused', 'compile') if b in reg))
")
MAIN=$(echo "$AVAILABLE" | tr ',' '\n' | grep -v '^compile$' | paste -sd, -)
echo "available: $AVAILABLE; main sweep: $MAIN"

# 1. The sweep. SIGINT at the cap: finished cells are already stored, the report uses them.
timeout -s INT 150 $TB run --model bert-base-uncased --dtype fp16 --backend "$MAIN" --batch 1,8,64,256 \
    --seq 128,512 --min-time 0.3 --baseline eager --timeout 90 --name gpu-report --db "$DB" \
    > "$WORK/run.log" 2>&1
echo "run exit code: $?"
tail -n 45 "$WORK/run.log"

# 2. torch.compile costs tens of seconds per shape: a few cells, into the same run, when time is left.
if echo "$AVAILABLE" | grep -qw compile && [ "$SECONDS" -lt 140 ]; then
    timeout -s INT 70 $TB run --model bert-base-uncased --dtype fp16 --backend compile --batch 1,64 --seq 128 \
        --min-time 0.3 --timeout 60 --name gpu-report --db "$DB" > "$WORK/compile.log" 2>&1
    echo "compile exit code: $?"
    tail -n 8 "$WORK/compile.log"
fi

# 3. The report.
$TB report gpu-report --db "$DB" --out "$WORK/report"
echo "report exit code: $?"
ls -la "$WORK/report"

# 4. Two identical sdpa runs, compared: a real-hardware check that noise is not called a regression.
for name in sdpa-a sdpa-b; do
    timeout -s INT 45 $TB run --model bert-base-uncased --dtype fp16 --backend sdpa --batch 8,64 --seq 128 \
        --min-time 0.3 --name "$name" --db "$DB" > "$WORK/$name.log" 2>&1
    echo "$name exit code: $?"
done
COLUMNS=160 $TB compare sdpa-a sdpa-b --db "$DB" > "$WORK/compare.txt" 2>&1
echo "compare exit code (0 = no regression): $?" | tee -a "$WORK/compare.txt"
$TB report sdpa-a sdpa-b --db "$DB" --out "$WORK/report-compare" > /dev/null 2>&1
echo "compare report exit code: $?"

# 5. What comes back: 8 files at most, directly under $OUT.
cp "$WORK/report/report.md" "$OUT/report.md"
for pattern in latency_throughput speedup mfu_heatmap latency_dist; do
    f=$(ls "$WORK/report/${pattern}"_*.png 2>/dev/null | head -n 1)
    [ -n "$f" ] && cp "$f" "$OUT/$(basename "$f")"
done
cp "$WORK/compare.txt" "$OUT/compare.txt"
{ cat "$WORK/run.log"; cat "$WORK/compile.log" 2>/dev/null; ls -la "$WORK/report"; \
  du -h "$WORK/report/report.html"; } > "$OUT/run_log.txt" 2>&1
set +x

echo "================ engine tables (report.md) ================"
sed -n '/^## Inference: latency and QPS per backend/,/^## Inference: every cell/p' "$WORK/report/report.md"
echo "================ cells without a valid measurement ================"
sed -n '/^## Cells without a valid measurement/,/^## Plots/p' "$WORK/report/report.md" | head -n 30
echo "================ compare sdpa-a vs sdpa-b ================"
cat "$WORK/compare.txt"
echo "total seconds: $SECONDS"
