"""Every engine's translations on test_2016_flickr are the native engine's.

A trained de-en model (``--model``) is exported for CTranslate2 (float32) and ONNX Runtime; the
first ``--lines`` lines of test_2016_flickr are translated with each engine in one process (the
model's batch size and stopping rule), greedy and with the model's beam size, and each engine's
best hypotheses are compared with native's: the share of identical lines (required: all) and the
largest difference of their scores (required: at most ``--tolerance``). One JSON line per engine
and search, then a summary with the machine.

A slow test: ``python -m pytest -m slow tests/test_slow_engine_parity.py`` (the README's
``python -m pytest -q`` leaves it out). Its size flags go in ``ATTNMT_SLOW_ENGINE_PARITY``, e.g.
``ATTNMT_SLOW_ENGINE_PARITY='--model runs/de-en --lines 1000'``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import machine, read_lines  # noqa: E402


def compare(model: Path, work: Path, lines: list[str], tolerance: float) -> list[dict]:
    from attnmt.interop.ctranslate2 import export_ctranslate2
    from attnmt.interop.engines import open_translator
    from attnmt.interop.onnx import export_onnx

    exports = {"ctranslate2": work / "ct2-float32", "onnxruntime": work / "onnx"}
    for engine, path in exports.items():
        if not path.exists():
            (export_ctranslate2 if engine == "ctranslate2" else export_onnx)(model, path)
    translators = {"native": open_translator(model, "native", "cpu"),
                   **{engine: open_translator(path, engine, "cpu") for engine, path in exports.items()}}
    decode = translators["native"].config.decode
    results = []
    for beam in (1, decode.beam_size):
        best = {name: [t.hypotheses[0] for t in tr.translate(lines, options=tr.options(beam_size=beam))]
                for name, tr in translators.items()}
        for engine in exports:
            pairs = list(zip(best[engine], best["native"]))
            same = [abs(a.score - b.score) for a, b in pairs if a.text == b.text]
            largest = max(same, default=float("nan"))
            results.append({"engine": engine, "beam": beam, "early_stopping": decode.early_stopping,
                            "lines": len(pairs), "identical": len(same) / len(pairs), "largest_score_difference":
                            largest, "ok": len(same) == len(pairs) and largest <= tolerance})
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/de-en", type=Path, help="a trained de-en model directory")
    ap.add_argument("--lines", type=int, default=1000, help="the first N lines of test_2016_flickr")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="the largest score difference allowed")
    ap.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "work" / "parity")
    ap.add_argument("--data", type=Path, default=os.environ.get("ATTNMT_DATA"))
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    lines = read_lines(args.data / "multi30k" / "test_2016_flickr.de.gz", args.lines)
    results = compare(args.model, args.work, lines, args.tolerance)
    for r in results:
        print(json.dumps(r), flush=True)
    failed = [f"{r['engine']} beam {r['beam']}" for r in results if not r["ok"]]
    print(json.dumps({"machine": machine(), "model": str(args.model), "failed": failed}))
    return 1 if failed else 0


@pytest.mark.slow
def test_engine_parity():
    argv = shlex.split(os.environ.get("ATTNMT_SLOW_ENGINE_PARITY", ""))
    if not os.environ.get("ATTNMT_DATA") or "--model" not in argv and not Path("runs/de-en").exists():
        pytest.skip("needs ATTNMT_DATA and a trained de-en model (--model)")
    assert main(argv) == 0


if __name__ == "__main__":
    sys.exit(main())
