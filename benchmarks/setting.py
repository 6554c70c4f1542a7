"""The suite's shared setting and what it runs on: the toolkits' environments and versions, the
config templates, the prepared data, the machine.

Every toolkit trains the same model on the same data (``configs/*.yaml``, filled in by
:meth:`Setting.fill`); the peers run from their own virtual environments under the work folder
(made by setup_peers.sh), attnmt in the interpreter that runs the suite.
"""

from __future__ import annotations

import importlib.metadata
import json
import string
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import HERE, read_lines, write_lines

TOOLKITS = ("attnmt", "attnmt-bf16", "joeynmt", "onmt", "eole")
PEERS = ("joeynmt", "onmt", "eole")  # each from its own virtual environment (setup_peers.sh)
MAX_OUTPUT = 100  # OpenNMT-py/CTranslate2 output cap (subwords); attnmt: 1.5 S + 10, JoeyNMT: 1.5 S
LABEL = {"attnmt": "attnmt", "attnmt-bf16": "attnmt (bf16 autocast)", "joeynmt": "JoeyNMT 2.3.0",
         "onmt": "OpenNMT-py 3.5.1", "eole": "eole 0.6.4"}


@dataclass
class Setting:
    """One suite run's options: folders, update and round counts, threads, toolkits."""

    work: Path
    data_src: Path
    updates: int
    rounds: int
    log_every: int
    warmup: int
    threads: int
    decode_batch: int
    test_lines: int
    attnmt_model: Path | None
    toolkits: tuple[str, ...]
    decode: bool
    decode_updates: int
    decode_rounds: int
    env: dict = field(default_factory=dict)
    bf16: bool = True  # the CPU has bfloat16 kernels (attnmt.precision.cpu_bf16_is_fast)

    @property
    def data(self) -> Path:
        return self.work / "data"

    @property
    def runs(self) -> Path:
        return self.work / "runs"

    def fill(self, template: str, dest: Path, updates: int | None = None, **extra) -> Path:
        """``configs/<template>`` filled in for this run (``updates`` defaults to the timed
        rounds' count), written to ``dest``."""
        text = string.Template((HERE / "configs" / template).read_text(encoding="utf-8")).substitute(
            data=self.data, updates=updates or self.updates, warmup=self.warmup, threads=self.threads,
            log_every=self.log_every, decode_batch=self.decode_batch, **extra)  # its $name placeholders
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
        return dest


def peer_venv(toolkit: str) -> Path:
    """The virtual environment setup_peers.sh makes for a peer (benchmarks/work/venv-*)."""
    return HERE / "work" / f"venv-{toolkit}"


def versions() -> dict:
    """Toolkit -> {package: version} for attnmt and the peers' environments that exist."""
    out = {"attnmt": {"attnmt": importlib.metadata.version("attnmt")}}
    for key, pkgs in (("joeynmt", ["joeynmt", "torch"]), ("onmt", ["OpenNMT-py", "ctranslate2", "torch"]),
                      ("eole", ["eole", "torch"])):
        py = peer_venv(key) / "bin/python"
        if py.exists():
            code = "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in %r}))" % pkgs
            r = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
            out[key] = json.loads(r.stdout) if r.returncode == 0 else {}
    return out


def plain_splits(data_src: Path, dest: Path, splits: tuple[str, ...], test_lines: int = 0) -> None:
    """Plain-text copies ``dest/{split}.{de,en}`` of ``data_src/{split}.{de,en}.gz`` (test splits
    are named ``test``; with ``test_lines`` only their first lines), made once."""
    dest.mkdir(parents=True, exist_ok=True)
    for split in splits:
        for lang in ("de", "en"):
            dst = dest / f"{'test' if split.startswith('test') else split}.{lang}"
            if not dst.exists():
                write_lines(dst, read_lines(data_src / f"{split}.{lang}.gz",
                                            test_lines if split.startswith("test") else None))


def prepare_data(s: Setting) -> dict:
    """Plain-text copies of the splits and one joint SentencePiece model (attnmt's settings:
    unigram, 8000 pieces, character coverage 1.0), shared by every toolkit. Returns the
    vocabulary size and the training pairs' (source, target) lengths with EOS, for the FLOP count."""
    plain_splits(s.data_src, s.data, ("train", "val", "test_2016_flickr"), s.test_lines)
    spm_path = s.data / "spm.model"
    from attnmt.data.tokenizers import Tokenizer

    if not spm_path.exists():
        t0 = time.perf_counter()
        Tokenizer.train(read_lines(s.data / "train.de") + read_lines(s.data / "train.en"), vocab_size=8000,
                        model_type="unigram", character_coverage=1.0, seed=1).save(spm_path)
        print(f"[bench] trained the joint SentencePiece model in {time.perf_counter() - t0:.1f} s", flush=True)
    tok = Tokenizer.load(spm_path)
    # the pieces without SentencePiece's own specials (ids 0-3): JoeyNMT and OpenNMT-py put their
    # own <unk>/<pad>/<s>/</s> first, so each vocabulary has 8000 entries
    pieces = tok.pieces(list(range(4, len(tok))))
    (s.data / "pieces.txt").write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
    # corpus statistics for the FLOP count: (source, target) lengths with EOS, as trained
    src, tgt = (tok.encode_batch(read_lines(s.data / f"train.{x}")) for x in ("de", "en"))
    lengths = [(len(a) + 1, len(b) + 1) for a, b in zip(src, tgt) if a and b and len(a) <= 100 and len(b) <= 100]
    return {"vocab_size": len(tok), "lengths": lengths}
