#!/usr/bin/env bash
# attnmt and its peers side by side, from the repository root (about 40-55 minutes on 2 cores):
#
#   bash benchmarks/run.sh                 # makes the peers' environments if needed, then the train suite
#   bash benchmarks/run.sh --updates 200   # any option of: python -m benchmarks train --help
#
# Multi30k is read from $ATTNMT_DATA/multi30k (or --data DIR); the figures go to benchmarks/records/train.jsonl.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
bash "$HERE/setup_peers.sh"
cd "$ROOT" && exec "$ROOT/.venv/bin/python" -m benchmarks train --part peers "$@"
