#!/usr/bin/env bash
# The end-to-end suite again, every kernel on a database of its own on one PostgreSQL server
# (Debian's postgresql package), so each path the tests drive runs on both stores. The tests of
# the PostgreSQL store and of replicas start servers of their own and run in the main pass.
# Arguments go to `cargo test` (see below).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$bin" ]; then
  echo "PostgreSQL is not installed: apt-get install postgresql" >&2
  exit 1
fi

# The tests drive grpcurl, the MCP client's Python and the MCP servers' Node packages: what
# tests/run.sh sets up (nothing, when it has already), first on PATH.
tests/run.sh --setup-only
# shellcheck disable=SC1091
. target/venv/bin/activate

dir=$(mktemp -d)
as=()
# initdb refuses root: the server runs as the postgres user then.
if [ "$(id -u)" = 0 ]; then
  chown postgres "$dir"
  as=(runuser -u postgres --)
fi
"${as[@]}" "$bin/initdb" -D "$dir/data" -U kernel --auth=trust -E UTF8 --no-sync --no-instructions >/dev/null
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
  -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=500" start >/dev/null
trap '"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1; rm -rf "$dir"' EXIT

# --workspace, as the main pass builds: `-p e2e` alone resolves features apart and rebuilds much of the tree.
# Arguments before a `--` go to cargo, after it to the test binary, as with `cargo test`.
cargo_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  cargo_args+=("$1")
  shift
done
[ $# -gt 0 ] && shift
KERNEL_TEST_POSTGRES="postgres://kernel@127.0.0.1:$port/postgres" \
  cargo test --workspace --test e2e "${cargo_args[@]}" -- --skip postgres:: --skip replicas:: "$@"
