#!/usr/bin/env bash
# Create the peers' virtual environments under benchmarks/work/ (never touching attnmt's .venv).
# Idempotent: an environment whose marker file exists is left as it is.
# Usage: bash benchmarks/setup_peers.sh [joeynmt] [onmt]   (no argument: both)
#   benchmarks/work/venv-joeynmt : torch 2.13.0 (CPU) + JoeyNMT 2.3.0
#   benchmarks/work/venv-onmt    : torch 2.13.0 (CPU) + OpenNMT-py 3.5.1 (--no-deps) + CTranslate2
# torch==2.13.0 is installed first in each: it is the local CPU wheel (PIP_FIND_LINKS);
# any other version would pull several GB of CUDA libraries.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="${BENCH_WORK:-$HERE/work}"
PY="${BENCH_PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
NICE="nice -n ${BENCH_NICE:-0}"
mkdir -p "$WORK"
PEERS="${*:-joeynmt onmt}"

pipq() {  # pip install into venv $1, quietly (drops the warnings about absent local index folders)
  local venv="$1" log; shift
  if ! log="$($NICE "$WORK/$venv/bin/pip" install -q "$@" 2>&1)"; then
    echo "$log" | grep -v "is ignored: it is neither" >&2
    echo "[setup] pip install failed in $venv: $*" >&2
    exit 1
  fi
  echo "$log" | grep -v "is ignored: it is neither" | grep -v "^$" || true
}

make_venv() {  # a fresh venv $1 with pip, wheel and the CPU torch wheel
  local dir="$WORK/$1"
  echo "[setup] creating $dir"
  rm -rf "$dir"
  "$PY" -m venv "$dir"
  pipq "$1" --upgrade pip wheel
  pipq "$1" "torch==2.13.0"
}

# --- JoeyNMT 2.3.0
if [[ " $PEERS " != *" joeynmt "* ]]; then :
elif [[ ! -f "$WORK/venv-joeynmt/.ready" ]]; then
  make_venv venv-joeynmt
  pipq venv-joeynmt "torch==2.13.0" "joeynmt==2.3.0" importlib_metadata \
      "sentencepiece==0.2.0" sacrebleu
  "$WORK/venv-joeynmt/bin/python" -c "import importlib.metadata as m, joeynmt.training, torch; print('[setup] joeynmt', m.version('joeynmt'), 'torch', torch.__version__)"
  touch "$WORK/venv-joeynmt/.ready"
else echo "[setup] venv-joeynmt ready"; fi

# --- OpenNMT-py 3.5.1 (pins torch<2.3, so --no-deps and its dependencies by hand) + CTranslate2
if [[ " $PEERS " != *" onmt "* ]]; then :
elif [[ ! -f "$WORK/venv-onmt/.ready" ]]; then
  make_venv venv-onmt
  pipq venv-onmt --no-deps "OpenNMT-py==3.5.1"
  pipq venv-onmt "torch==2.13.0" configargparse pyonmttok ctranslate2 \
      "sentencepiece==0.2.0" sacrebleu pyyaml six rapidfuzz pyahocorasick tensorboard flask waitress \
      spacy fasttext-wheel "numpy<2.3"
  "$WORK/venv-onmt/bin/python" -c "import onmt, onmt.bin.train, onmt.bin.translate, ctranslate2, torch; print('[setup] onmt', onmt.__version__, 'ctranslate2', ctranslate2.__version__, 'torch', torch.__version__)"
  touch "$WORK/venv-onmt/.ready"
else echo "[setup] venv-onmt ready"; fi
