"""An OpenNMT-py model of the default preset's size, converted to CTranslate2: the peer row of
``engines.py`` (CTranslate2's own time for a converted OpenNMT-py model of the same size).

The preset (``configs/multi30k_de_en.yaml``) is d_model 256, 3+3 layers, 8 heads, d_ff 1024 over
one joint SentencePiece vocabulary of 8000 pieces with shared embeddings; this trains OpenNMT-py
3.5.1 (``benchmarks/work/venv-onmt``, made by ``setup_peers.sh``) with the suite's shared setting
(``configs/onmt.yaml``) at that d_ff, on the suite's joint SentencePiece model, for ``--updates``
updates, then converts its checkpoint with ``ct2-opennmt-py-converter --quantization int8``.
OpenNMT-py is pre-norm where the preset is post-norm: the same parameter count and the same
matmuls per decoding step (two final LayerNorms more).

A peer trained for far fewer updates than the preset emits outputs of other lengths, and a beam
search's time follows the number of tokens it emits: ``engines.py`` reports output pieces and
milliseconds per 1000 output pieces beside the seconds for that reason.

Usage (from the repository root):
    bash benchmarks/setup_peers.sh onmt
    .venv/bin/python benchmarks/onmt_peer.py --updates 800
    # -> benchmarks/work/onmt_peer/ct2-int8 (the CTranslate2 model), .../data/spm.model
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from measure import run  # noqa: E402
from setting import Setting, peer_venv, prepare_data  # noqa: E402
from training import train_onmt  # noqa: E402


@dataclass
class PresetSize(Setting):
    """The suite's setting with OpenNMT-py's ``transformer_ff`` set to ``d_ff``."""

    d_ff: int = 1024

    def fill(self, template: str, dest: Path, updates: int | None = None, **extra) -> Path:
        path = super().fill(template, dest, updates, **extra)
        text = path.read_text(encoding="utf-8")
        if "transformer_ff: 512\n" not in text:
            raise SystemExit(f"{template} no longer says 'transformer_ff: 512'")
        path.write_text(text.replace("transformer_ff: 512\n", f"transformer_ff: {self.d_ff}\n"), encoding="utf-8")
        return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=800)
    ap.add_argument("--warmup", type=int, default=400, help="noam warm-up updates (OpenNMT-py's learning_rate 1.0)")
    ap.add_argument("--d-ff", type=int, default=1024, help="the preset's d_ff")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA", "/work/shared/data"))
    ap.add_argument("--work", type=Path, default=HERE / "work" / "onmt_peer")
    args = ap.parse_args()
    env = {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads), "PYTHONWARNINGS": "ignore",
           "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    s = PresetSize(work=args.work.resolve(), data_src=Path(args.data_dir) / "multi30k", updates=args.updates,
                   rounds=1, log_every=50, warmup=args.warmup, threads=args.threads, decode_batch=128, test_lines=0,
                   nice=0, attnmt_model=None, toolkits=("onmt",), decode=True, decode_updates=args.updates,
                   decode_rounds=1, results=args.work / "unused.md", command=" ".join(sys.argv), env=env,
                   d_ff=args.d_ff)
    prepare_data(s)
    t0 = time.perf_counter()
    rec = train_onmt(s, s.runs / "onmt", updates=args.updates)
    print(f"[onmt_peer] {rec['updates']} updates in {time.perf_counter() - t0:.0f} s, "
          f"{rec['rate']:.0f} target tokens/s; checkpoint {rec['model']}", flush=True)
    out = s.work / "ct2-int8"
    bin_dir = peer_venv(s.work.parent, "onmt") / "bin"
    run([str(bin_dir / "ct2-opennmt-py-converter"), "--model_path", rec["model"], "--output_dir", str(out),
         "--quantization", "int8", "--unsafe_deserialization", "--force"], s.work / "ct2-convert.log", env=env)
    print(f"[onmt_peer] CTranslate2 model: {out}; SentencePiece model: {s.data / 'spm.model'}")


if __name__ == "__main__":
    main()
