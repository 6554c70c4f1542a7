"""The suite's shared setting and what it runs on: the toolkits' environments and versions, the
config templates, the prepared data, the machine.

Every toolkit trains the same model on the same data (``configs/*.yaml``, filled in by
:meth:`Setting.fill`); the peers run from their own virtual environments under the work folder
(made by setup_peers.sh), attnmt from the repository's ``.venv``.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import os
import platform
import string
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TOOLKITS = ("attnmt", "attnmt-bf16", "joeynmt", "onmt")
MAX_OUTPUT = 100  # OpenNMT-py/CTranslate2 output cap (subwords); attnmt: 1.5 S + 10, JoeyNMT: 1.5 S
LABEL = {"attnmt": "attnmt", "attnmt-bf16": "attnmt (bf16 autocast)", "joeynmt": "JoeyNMT 2.3.0",
         "onmt": "OpenNMT-py 3.5.1"}


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
    nice: int
    attnmt_model: Path | None
    toolkits: tuple[str, ...]
    decode: bool
    decode_updates: int
    decode_rounds: int
    results: Path
    command: str
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
        text = fill_template(template, data=self.data, updates=updates or self.updates, warmup=self.warmup,
                             threads=self.threads, log_every=self.log_every, decode_batch=self.decode_batch, **extra)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
        return dest


def fill_template(template: str, **values) -> str:
    """The text of ``configs/<template>`` with its ``$name`` placeholders filled from ``values``."""
    return string.Template((HERE / "configs" / template).read_text(encoding="utf-8")).substitute(**values)


def peer_venv(work_root: Path, toolkit: str) -> Path:
    """The virtual environment of a peer ('joeynmt'; 'onmt', which also holds CTranslate2)."""
    return work_root / ("venv-joeynmt" if toolkit == "joeynmt" else "venv-onmt")


def versions(work_root: Path) -> dict:
    """Toolkit -> {package: version} for attnmt and the peers' environments that exist."""
    try:
        attnmt = importlib.metadata.version("attnmt")
    except Exception:  # noqa: BLE001 - informational only
        attnmt = "?"
    out = {"attnmt": {"attnmt": attnmt}}
    for key, venv, pkgs in (("joeynmt", "venv-joeynmt", ["joeynmt", "torch"]),
                            ("onmt", "venv-onmt", ["OpenNMT-py", "ctranslate2", "torch"])):
        py = work_root / venv / "bin/python"
        if py.exists():
            code = "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in %r}))" % pkgs
            r = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
            out[key] = json.loads(r.stdout) if r.returncode == 0 else {}
    return out


def cpu_fields() -> dict[str, str]:
    """Processor 0's ``key: value`` lines of /proc/cpuinfo ('model name', 'cpu family', 'model',
    'flags', ...); empty where there is no /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    first_cpu = info.split("\n\n", 1)[0]
    return {key.strip(): value.strip() for key, _, value in (ln.partition(":") for ln in first_cpu.splitlines())}


def cpu_name(fields: dict[str, str]) -> str:
    """'MODEL NAME (family F model M)' from :func:`cpu_fields` (CPUs of one name differ by
    generation: an EPYC of family 23 is about half as fast as one of family 25)."""
    return (f"{fields.get('model name', 'unknown CPU')} (family {fields.get('cpu family', '?')} "
            f"model {fields.get('model', '?')})")


def machine_info(probe: dict) -> dict:
    """CPU model (name, family and model number), cores, memory (GiB), vector ISA flags, kernel,
    Python and (from the matmul probe) torch versions."""
    cpu = cpu_fields()
    mem = 0
    try:
        mem = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines()
                       if ln.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration):
        pass
    flags = cpu.get("flags", "").split()
    isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags)
    return {"cpu": cpu_name(cpu), "cores": os.cpu_count(), "mem_gib": round(mem / 2**30, 1), "isa": isa,
            "kernel": platform.release(), "python": platform.python_version(), "torch": probe.get("torch")}


def plain_splits(data_src: Path, dest: Path, splits: tuple[str, ...], test_lines: int = 0) -> None:
    """Plain-text copies ``dest/{split}.{de,en}`` of ``data_src/{split}.{de,en}.gz`` (test splits
    are named ``test``; with ``test_lines`` only their first lines), made once."""
    dest.mkdir(parents=True, exist_ok=True)
    for split in splits:
        for lang in ("de", "en"):
            dst = dest / f"{'test' if split.startswith('test') else split}.{lang}"
            if not dst.exists():
                with gzip.open(data_src / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                    lines = f.read().split("\n")
                if lines and lines[-1] == "":
                    lines.pop()
                if split.startswith("test") and test_lines:
                    lines = lines[: test_lines]
                dst.write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")


def prepare_data(s: Setting) -> dict:
    """Plain-text copies of the splits and one joint SentencePiece model (attnmt's settings:
    unigram, 8000 pieces, character coverage 1.0), shared by every toolkit. Returns the
    vocabulary size and the training pairs' (source, target) lengths with EOS, for the FLOP count."""
    plain_splits(s.data_src, s.data, ("train", "val", "test_2016_flickr"), s.test_lines)
    spm_path = s.data / "spm.model"
    from attnmt.data.tokenizers import Tokenizer

    if not spm_path.exists():
        t0 = time.perf_counter()
        text = (s.data / "train.de").read_text(encoding="utf-8").splitlines() + \
            (s.data / "train.en").read_text(encoding="utf-8").splitlines()
        Tokenizer.train(text, vocab_size=8000, model_type="unigram", character_coverage=1.0, seed=1).save(spm_path)
        print(f"[bench] trained the joint SentencePiece model in {time.perf_counter() - t0:.1f} s", flush=True)
    tok = Tokenizer.load(spm_path)
    # the pieces without SentencePiece's own specials (ids 0-3): JoeyNMT and OpenNMT-py put their
    # own <unk>/<pad>/<s>/</s> first, so each vocabulary has 8000 entries
    pieces = tok.pieces(list(range(4, len(tok))))
    (s.data / "pieces.txt").write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
    # corpus statistics for the FLOP count: (source, target) lengths with EOS, as trained
    src = tok.encode_batch((s.data / "train.de").read_text(encoding="utf-8").splitlines())
    tgt = tok.encode_batch((s.data / "train.en").read_text(encoding="utf-8").splitlines())
    lengths = [(len(a) + 1, len(b) + 1) for a, b in zip(src, tgt) if a and b and len(a) <= 100 and len(b) <= 100]
    return {"vocab_size": len(tok), "lengths": lengths}
