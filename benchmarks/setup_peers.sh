#!/usr/bin/env bash
# The peers' virtual environments under benchmarks/work/ (attnmt's .venv untouched); one whose
# .ready marker exists is kept. Usage: bash benchmarks/setup_peers.sh [joeynmt] [onmt] [eole] (no argument: all)
#   venv-joeynmt: torch 2.13.0 (CPU) + JoeyNMT 2.3.0
#   venv-onmt:    torch 2.13.0 (CPU) + OpenNMT-py 3.5.1 (--no-deps: it pins torch<2.3) + CTranslate2
#   venv-eole:    torch 2.13.0 (CPU) + eole 0.6.4 (OpenNMT-py's successor; it asks torch>=2.10,<2.15)
# torch==2.13.0 goes first: the local CPU wheel (PIP_FIND_LINKS), the same source as attnmt's; another
# version pulls GBs of CUDA. JoeyNMT and OpenNMT-py are required (exit 1 when one fails); eole is not:
# when it cannot be installed beside this torch, one line says why, and venv-eole/UNAVAILABLE keeps the
# reason for the train suite (its row in RESULTS.md).
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
    if [[ "$venv" == venv-eole ]]; then  # optional: the reason in one line, kept for the suite
      reason="$(echo "$log" | grep -v "is ignored: it is neither" | grep -iE "error|conflict|requires" | head -1)"
      echo "pip install $* failed beside torch 2.13.0: ${reason:-see the pip output}" > "$WORK/$venv/UNAVAILABLE"
      echo "[setup] eole left out: $(cat "$WORK/$venv/UNAVAILABLE")"
      return 1
    fi
    echo "$log" | grep -v "is ignored: it is neither" >&2
    echo "[setup] pip install failed in $venv: $*" >&2
    exit 1
  fi
  echo "$log" | grep -v "is ignored: it is neither" | grep -v "^$" || true
}

for peer in ${*:-joeynmt onmt eole}; do
  venv="venv-$peer"
  case "$peer" in joeynmt|onmt|eole) ;; *) echo "[setup] unknown peer '$peer': joeynmt, onmt or eole" >&2; exit 2 ;; esac
  if [[ -f "$WORK/$venv/.ready" ]]; then echo "[setup] $venv ready"; continue; fi
  echo "[setup] creating $WORK/$venv"
  rm -rf "${WORK:?}/$venv" && "$PY" -m venv "$WORK/$venv"
  pipq "$venv" --upgrade pip wheel
  pipq "$venv" "torch==2.13.0"
  if [[ "$peer" == eole ]]; then
    pipq "$venv" "torch==2.13.0" "eole==0.6.4" sacrebleu || continue
    check="import importlib.metadata as m, eole.bin.main as _; print('[setup] eole', m.version('eole'))"
  elif [[ "$peer" == joeynmt ]]; then
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
