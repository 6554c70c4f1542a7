#!/usr/bin/env bash
# attnmt's benchmark suite in one command, from the repository root:
#
#   bash benchmarks/run.sh                 # about 40-55 minutes on a 2-core machine
#   bash benchmarks/run.sh --updates 200   # any option of benchmarks/bench.py (--help lists them)
#
# 1. makes the peers' virtual environments under benchmarks/work/ (gitignored; first time only,
#    about 2-3 minutes): JoeyNMT 2.3.0, and OpenNMT-py 3.5.1 + CTranslate2, each on the CPU torch 2.13.0;
# 2. runs benchmarks/bench.py in attnmt's own .venv (made here with attnmt installed editable if
#    absent): machine limit, alternating training rounds, translation, memory;
# 3. writes its report to benchmarks/work/suite/report.md (raw numbers: results.json beside it).
# Multi30k is read from $ATTNMT_DATA/multi30k (or --data-dir DIR).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"

if [[ ! -x "$ROOT/.venv/bin/attnmt" ]]; then
  echo "[run] making attnmt's .venv"
  "${BENCH_PYTHON:-python3.11}" -m venv "$ROOT/.venv"
  "$ROOT/.venv/bin/pip" install -q "torch==2.13.0"
  "$ROOT/.venv/bin/pip" install -q -e "$ROOT"
fi
bash "$HERE/setup_peers.sh"
export BENCH_COMMAND="bash benchmarks/run.sh${*:+ $*}"
exec "$ROOT/.venv/bin/python" "$HERE/bench.py" "$@"
