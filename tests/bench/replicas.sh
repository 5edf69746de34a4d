#!/usr/bin/env bash
# Kernel replicas on one PostgreSQL, side by side, in one sitting: the sustained section of
# `kernelctl bench` against 1, 2 and 3 replicas, each replica with a bench process of its own
# pinned to it (its agents and its workers), the concurrent runs split evenly between them.
#
#   tests/bench/replicas.sh [--delay-ms MS] [--for DURATION] [--runs N] [--rounds N]
#                           [--replicas "1 2 3"] [--json FILE] [--bin-dir DIR]
#
# --delay-ms MS   a delay-proxy (tests/src/bin/delay_proxy.rs) between each replica and PostgreSQL
#                 holds each direction back MS ms (1 to 2 ms for 1: the timer ticks in ms), as a
#                 network between machines would: replicas bound by round trips, not by this
#                 machine's cores
# --for           how long each measurement runs (default 10s)
# --runs          concurrent runs in all, split between the replicas (default 64)
# --rounds        rounds; the replica counts take turns, reversed every other round (default 3)
# --top N         after each measurement, print its N most frequent statements (pg_stat_statements)
# --bin-dir DIR   the kernel and kernelctl to measure, from another build (a release build of an
#                 earlier commit, to compare in one sitting); default: this tree's, built here
#
# Each measurement gets a fresh database on one server started here (Debian's postgresql package,
# its default durability: fsync on, synchronous_commit on) with pg_stat_statements loaded, fresh
# replicas (release build) and fresh bench processes. Per measurement it records: calls/s (the sum
# over the bench processes), the mean of their p50 and the worst p99, the replicas' CPU per call,
# SQL statements per call (every statement pg_stat_statements counted in the kernel's database over
# the calls made: readers' and the feed's included, and with track=all the foreign-key checks run
# inside inserts) and the share of 20 ms samples of pg_locks
# in which a lock in that database was waited for. The table gives, per replica count, the median
# and the range over the rounds.
set -euo pipefail
cd "$(dirname "$0")/../.."

delay=0 duration=10s runs=64 rounds=3 counts="1 2 3" json="" top=0 bin_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --delay-ms) delay=$2; shift 2 ;;
    --for) duration=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --replicas) counts=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --top) top=$2; shift 2 ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$bin" ]; then
  echo "PostgreSQL is not installed: apt-get install postgresql" >&2
  exit 1
fi
cargo build --release -q -p e2e --bin delay-proxy
if [ -n "$bin_dir" ]; then
  target=$(cd "$bin_dir" && pwd)
else
  cargo build --release -q -p kernel -p kernelctl --bin kernel --bin kernelctl
  target=target/release
fi

dir=$(mktemp -d)
as=()
if [ "$(id -u)" = 0 ]; then
  chown postgres "$dir"
  as=(runuser -u postgres --)
fi
pids=()
cleanup() {
  for pid in "${pids[@]}"; do { kill -9 "$pid" && wait "$pid"; } 2>/dev/null || true; done
  "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
"${as[@]}" "$bin/initdb" -D "$dir/data" -U kernel --auth=trust -E UTF8 --no-instructions >/dev/null
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -o "-p $port -k $dir -c listen_addresses=127.0.0.1 \
  -c max_connections=300 -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all" \
  start >/dev/null
psql() { "$bin/psql" -h 127.0.0.1 -p "$port" -U kernel -At -v ON_ERROR_STOP=1 "$@"; }
psql -d postgres -c "CREATE EXTENSION pg_stat_statements" >/dev/null

# One measurement: $1 replicas, round $2; appends a JSON line to $dir/results.
measure() {
  local n=$1 round=$2 db="bench_${2}_${1}" started=()
  psql -d postgres -c "CREATE DATABASE $db" >/dev/null
  local url="postgres://kernel@127.0.0.1:$port/$db"
  local addrs=() kernels=() proxies=()
  rm -f "$dir"/proxy.*
  for i in $(seq 1 "$n"); do
    local via=$url
    if [ "$delay" != 0 ]; then
      target/release/delay-proxy --upstream "127.0.0.1:$port" --delay-ms "$delay" >"$dir/proxy.$i" &
      pids+=($!)
      proxies+=($!)
      until [ -s "$dir/proxy.$i" ]; do sleep 0.05; done
      via="postgres://kernel@$(head -n 1 "$dir/proxy.$i")/$db"
    fi
    "$target/kernel" --db "$via" --listen 127.0.0.1:0 --max-calls-per-turn 1000 2>"$dir/kernel.$i" &
    pids+=($!)
    kernels+=($!)
  done
  for i in $(seq 1 "$n"); do
    until grep -q '"listening"\|listening' "$dir/kernel.$i" 2>/dev/null; do sleep 0.1; done
    addrs+=("http://$(grep -o 'addr=[0-9.:]*' "$dir/kernel.$i" | head -n 1 | cut -d= -f2)")
  done
  # Measured once the shards have settled, each replica owning its share: runs are made in a
  # shard their replica owns, so agents, workers and writes stay on one replica, as they do among
  # replicas running for long.
  local settled=0
  for _ in $(seq 1 300); do
    settled=$(psql -d "$db" -c "SELECT count(DISTINCT owner) = $n AND count(*) FILTER (WHERE owner IS NULL) = 0 \
      FROM shards")
    [ "$settled" = t ] && break
    sleep 0.1
  done
  # Each replica is handed its share over several beats: settled once the owners and epochs stay
  # as they are for more than a heartbeat (3 s).
  local before="" now=""
  for _ in $(seq 1 15); do
    now=$(psql -d "$db" -c "SELECT string_agg(owner || ':' || epoch, ',' ORDER BY id) FROM shards")
    [ -n "$before" ] && [ "$now" = "$before" ] && break
    before=$now
    sleep 4
  done
  [ "$settled" = t ] && [ "$now" = "$before" ] ||
    echo "replicas=$n round=$round: the shards did not settle within 90 s" >&2
  psql -d postgres -c "SELECT pg_stat_statements_reset()" >/dev/null
  # pg_locks every 20 ms on one connection: how many locks in the database were waited for.
  (while [ ! -e "$dir/stop.$db" ] && sleep 0.02; do
     echo "SELECT count(*) FILTER (WHERE NOT granted) FROM pg_locks WHERE database = (SELECT oid FROM pg_database WHERE datname = '$db');"
   done | psql -d postgres >"$dir/locks.$db" 2>/dev/null) &
  local sampler=$!
  local cpu_before=0
  for pid in "${kernels[@]}"; do cpu_before=$((cpu_before + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
  for i in $(seq 1 "$n"); do
    "$target/kernelctl" bench --addr "${addrs[$((i - 1))]}" --sections sustained --sustained-for "$duration" \
      --sustained-concurrency $((runs / n)) --json >"$dir/bench.$i" 2>"$dir/bench.$i.log" &
    started+=($!)
  done
  for pid in "${started[@]}"; do wait "$pid"; done
  local cpu_after=0
  for pid in "${kernels[@]}"; do cpu_after=$((cpu_after + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
  touch "$dir/stop.$db"
  wait "$sampler" || true
  local statements
  statements=$(psql -d postgres -c "SELECT COALESCE(sum(s.calls), 0) FROM pg_stat_statements s JOIN pg_database d \
    ON d.oid = s.dbid WHERE d.datname = '$db'")
  if [ "$top" != 0 ]; then
    echo "replicas=$n round=$round: the $top most frequent statements, calls per call made:" >&2
    psql -d postgres -F ' | ' -c "SELECT s.calls, left(regexp_replace(s.query, '\s+', ' ', 'g'), 140) FROM \
      pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '$db' ORDER BY s.calls DESC \
      LIMIT $top" >"$dir/top"
    python3 -c "
import json, sys
calls = sum(json.load(open(f'$dir/bench.{i}'))['sustained']['calls'] for i in range(1, $n + 1))
for line in open('$dir/top'):
    count, query = line.rstrip('\n').split(' | ', 1)
    print(f'{int(count) / calls:8.2f}  {query}')
" >&2
  fi
  for pid in "${kernels[@]}" "${proxies[@]}"; do { kill -9 "$pid" && wait "$pid"; } 2>/dev/null || true; done
  python3 - "$dir" "$n" "$round" "$statements" $((cpu_after - cpu_before)) "$(getconf CLK_TCK)" >>"$dir/results" <<'PY'
import json, sys
d, n, round_, statements, ticks, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
benches = [json.load(open(f"{d}/bench.{i}"))["sustained"] for i in range(1, n + 1)]
calls = sum(b["calls"] for b in benches)
seconds = max(b["seconds"] for b in benches)
samples = [int(line) for line in open(f"{d}/locks.bench_{round_}_{n}") if line.strip().isdigit()]
print(json.dumps({
    "replicas": n, "round": round_,
    "calls": calls, "calls_per_s": calls / seconds,
    "p50_ms": sum(b["p50_ms"] for b in benches) / n, "p99_ms": max(b["p99_ms"] for b in benches),
    "cpu_ms_per_call": ticks * 1000 / hz / calls if calls else None,
    "statements_per_call": statements / calls if calls else None,
    "lock_wait_share": sum(1 for s in samples if s > 0) / len(samples) if samples else None,
    "lock_samples": len(samples),
}))
PY
  psql -d postgres -c "DROP DATABASE $db WITH (FORCE)" >/dev/null
  echo "replicas=$n round=$round: $(tail -n 1 "$dir/results")" >&2
}

for round in $(seq 1 "$rounds"); do
  order=$counts
  if [ $((round % 2)) = 0 ]; then order=$(echo "$counts" | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for n in $order; do measure "$n" "$round"; done
done

[ -n "$json" ] && cp "$dir/results" "$json"
python3 - "$dir/results" "$delay" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
delay = sys.argv[2]
print(f"replicas on PostgreSQL, {'a ' + delay + ' ms delay each way' if delay != '0' else 'bare loopback'}: median (range) over {len({r['round'] for r in rows})} rounds")
print(f"{'replicas':>8}  {'calls/s':>24}  {'p50 ms':>18}  {'CPU ms/call':>18}  {'statements/call':>18}  {'lock waits':>16}")
def cell(values, fmt):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"
for n in sorted({r["replicas"] for r in rows}):
    mine = [r for r in rows if r["replicas"] == n]
    print(f"{n:>8}  {cell([r['calls_per_s'] for r in mine], lambda v: f'{v:,.0f}'):>24}  "
          f"{cell([r['p50_ms'] for r in mine], lambda v: f'{v:.1f}'):>18}  "
          f"{cell([r['cpu_ms_per_call'] for r in mine], lambda v: f'{v:.3f}'):>18}  "
          f"{cell([r['statements_per_call'] for r in mine], lambda v: f'{v:.1f}'):>18}  "
          f"{cell([r['lock_wait_share'] for r in mine], lambda v: f'{v:.0%}'):>16}")
PY
