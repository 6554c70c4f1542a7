#!/usr/bin/env bash
# The peers' virtual environments under benchmarks/work/ (attnmt's .venv untouched); one whose
# .ready marker exists is kept. Usage: bash benchmarks/setup_peers.sh [joeynmt] [onmt] (no argument: both)
#   venv-joeynmt: torch 2.13.0 (CPU) + JoeyNMT 2.3.0
#   venv-onmt:    torch 2.13.0 (CPU) + OpenNMT-py 3.5.1 (--no-deps: it pins torch<2.3) + CTranslate2
# torch==2.13.0 goes first: the local CPU wheel (PIP_FIND_LINKS); another version pulls GBs of CUDA.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="${BENCH_WORK:-$HERE/work}"
PY="${BENCH_PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
NICE="nice -n ${BENCH_NICE:-0}"
mkdir -p "$WORK"

pipq() {  # pip install into venv $1, quietly (drops the warnings about absent local index folders)
  local venv="$1" log; shift
  if ! log="$($NICE "$WORK/$venv/bin/pip" install -q "$@" 2>&1)"; then
    echo "$log" | grep -v "is ignored: it is neither" >&2
    echo "[setup] pip install failed in $venv: $*" >&2
    exit 1
  fi
  echo "$log" | grep -v "is ignored: it is neither" | grep -v "^$" || true
}

for peer in ${*:-joeynmt onmt}; do
  venv="venv-$peer"
  case "$peer" in joeynmt|onmt) ;; *) echo "[setup] unknown peer '$peer': joeynmt or onmt" >&2; exit 2 ;; esac
  if [[ -f "$WORK/$venv/.ready" ]]; then echo "[setup] $venv ready"; continue; fi
  echo "[setup] creating $WORK/$venv"
  rm -rf "${WORK:?}/$venv" && "$PY" -m venv "$WORK/$venv"
  pipq "$venv" --upgrade pip wheel
  pipq "$venv" "torch==2.13.0"
  if [[ "$peer" == joeynmt ]]; then
    pipq "$venv" "torch==2.13.0" "joeynmt==2.3.0" importlib_metadata "sentencepiece==0.2.0" sacrebleu
    check="import importlib.metadata as m, joeynmt.training as _; print('[setup] joeynmt', m.version('joeynmt'))"
  else
    pipq "$venv" --no-deps "OpenNMT-py==3.5.1"
    pipq "$venv" "torch==2.13.0" configargparse pyonmttok ctranslate2 "sentencepiece==0.2.0" sacrebleu pyyaml six \
        rapidfuzz pyahocorasick tensorboard flask waitress spacy fasttext-wheel "numpy<2.3"
    check="import onmt, onmt.bin.train, onmt.bin.translate, ctranslate2; print('[setup] onmt', onmt.__version__, 'ctranslate2', ctranslate2.__version__)"
  fi
  "$WORK/$venv/bin/python" -c "$check; import torch; print('[setup] torch', torch.__version__)"
  touch "$WORK/$venv/.ready"
done
