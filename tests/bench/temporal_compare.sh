#!/usr/bin/env bash
# The same workload on Temporal and on the kernel, on this machine, in one run:
# N no-op calls in sequence (ms per call) and N at once (calls/s).
#
#   tests/bench/temporal_compare.sh [--json FILE] [N]        # N defaults to 300
#
# Now compare.sh with only those two peers (see it for what each side runs; ROUNDS works here too).
# Temporal: `temporal server start-dev` on SQLite, temporal_bench.py timing one workflow making N
# activity calls in sequence and one making N at once. Kernel: target/release (else target/debug),
# default durability, `kernelctl bench --workers 1` with N sequential calls, N concurrent runs of
# one call each, and one turn of N calls. Needs python3 with venv, and pip access to PyPI.
# tests/bench/compare.sh adds Restate.
set -euo pipefail
PEERS=temporal,kernel exec "$(dirname "${BASH_SOURCE[0]}")/compare.sh" "$@"
