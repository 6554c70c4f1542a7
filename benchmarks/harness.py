"""What every suite shares: the data option, running a process, alternating rounds, the machine,
records, reading corpora, and ``attnmt translate``'s command line and log line.

- :func:`add_common` gives a suite's parser ``--data`` (default ``$ATTNMT_DATA``, the folder
  holding ``multi30k/``), ``--smoke`` (seconds-sized run), ``--work`` and ``--no-record``.
- :func:`run` starts a command and measures it: wall seconds and the peak of the summed resident
  memory of its whole process tree, sampled with psutil every 0.1 s.
- :func:`alternate` times several jobs in rounds whose order reverses every round (A B C, then
  C B A, ...), so that a machine's drift hits every job alike, and keeps each job's fastest round.
- :func:`machine` describes the CPU (vendor, family, model, the flags that pick PyTorch's and
  CTranslate2's kernels, cores); every record carries it.
- :func:`record` appends one JSON line per figure to ``benchmarks/records/SUITE.jsonl``:
  figure, value, unit, machine, date, commit and the exact command line.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RECORDS = HERE / "records"
WORK = HERE / "work"
POLL_S = 0.1
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8")
TRANSLATED = re.compile(r"translated (\d+) lines in ([\d.]+) s")


def add_common(parser) -> None:
    """The options every suite has."""
    parser.add_argument("--data", type=Path, default=os.environ.get("ATTNMT_DATA"),
                        help="the folder holding multi30k/ (default $ATTNMT_DATA)")
    parser.add_argument("--smoke", action="store_true", help="a seconds-sized run that checks the suite works")
    parser.add_argument("--work", type=Path, default=WORK, help="work folder (default benchmarks/work)")
    parser.add_argument("--no-record", action="store_true", help="print the records instead of appending them")


def corpus(args, split: str, lang: str) -> Path:
    """``DATA/multi30k/SPLIT.LANG.gz``; exits naming ``--data`` when the folder is not given."""
    if not args.data:
        raise SystemExit("no data: pass --data DIR or set ATTNMT_DATA (the folder holding multi30k/)")
    return Path(args.data) / "multi30k" / f"{split}.{lang}.gz"


def read_lines(path: Path, limit: int | None = None) -> list[str]:
    """The lines of a text file, gzip-compressed or not (its first ``limit`` if given)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[:limit] if limit else lines


def write_lines(path: Path, lines: list[str]) -> Path:
    """Plain text, one line each; the parent folder made if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@dataclass
class Proc:
    """A finished command: wall seconds, peak resident bytes of its process tree, its output."""

    cmd: list[str]
    seconds: float
    peak_rss: int
    output: str
    memory: PeakRSS | None = None


class PeakRSS:
    """Peaks of a process tree's memory, sampled every 0.1 s while in its ``with`` block: ``peak`` of the
    summed RSS (``current`` the latest), ``each`` the peak RSS of every process, and with ``pss`` the
    peak of the summed PSS (forked workers share pages that RSS would count twice)."""

    def __init__(self, pid: int, pss: bool = False) -> None:
        self.proc, self.with_pss, self.stop = psutil.Process(pid), pss, threading.Event()
        self.peak = self.current = self.pss = 0
        self.each: dict[int, int] = {}
        self.thread = threading.Thread(target=self._poll, daemon=True)

    def _sample(self) -> None:
        total = pss = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                info = p.memory_full_info() if self.with_pss else p.memory_info()
            except psutil.Error:
                continue
            total += info.rss
            pss += getattr(info, "pss", 0)
            self.each[p.pid] = max(self.each.get(p.pid, 0), info.rss)
        self.current, self.peak, self.pss = total, max(self.peak, total), max(self.pss, pss)

    def _poll(self) -> None:
        while not self.stop.is_set():
            try:
                self._sample()
            except psutil.Error:
                return
            self.stop.wait(POLL_S)

    def __enter__(self) -> PeakRSS:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def run(cmd: list[str], env: dict | None = None, cwd: Path | None = None, check: bool = True, pss: bool = False,
        log: Path | None = None, stdin: Path | None = None, stdout: Path | None = None) -> Proc:
    """Run ``cmd`` to its end: wall seconds, peak tree RSS (``Proc.memory``: the :class:`PeakRSS`, with
    every process's peak and, if ``pss``, the summed PSS's) and its output, stdout and stderr together
    (stderr alone when ``stdout`` names a file for stdout); ``stdin`` a file to read; ``log`` a file that
    gets the command line and the output. A non-zero exit raises SystemExit with the output's tail
    (RuntimeError when ``check`` is "raise"; nothing when false)."""
    cmd = [str(c) for c in cmd]
    print(f"[bench] $ {shlex.join(cmd)}", file=sys.stderr, flush=True)
    fin = open(stdin, "rb") if stdin else subprocess.DEVNULL
    fout = open(stdout, "wb") if stdout else subprocess.PIPE
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=fin, stdout=fout, stderr=subprocess.PIPE if stdout else subprocess.STDOUT,
                         env=dict(os.environ, **(env or {})), cwd=cwd)
    with PeakRSS(p.pid, pss) as rss:
        out = b"".join(x or b"" for x in p.communicate()).decode("utf-8", "replace")
        seconds = time.perf_counter() - t0
    for f in (f for f in (fin, fout) if hasattr(f, "close")):
        f.close()
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {shlex.join(cmd)}\n{out}", encoding="utf-8")
    if check and p.returncode:
        message = f"failed ({p.returncode}): {shlex.join(cmd)}\n{out[-3000:]}"
        raise RuntimeError(message) if check == "raise" else SystemExit(message)
    return Proc(cmd, seconds, rss.peak, out, rss)


def alternate(jobs: dict, rounds: int, key: str = "seconds", once: set = frozenset()) -> dict:
    """Run every job (name -> callable returning a dict with ``key``, or None when it failed) ``rounds``
    times, the order reversed every round (``once``: the first round only); each job's fastest round,
    with every round's ``key`` under "rounds"."""
    best: dict = {}
    names = list(jobs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            result = None if r and name in once else jobs[name]()
            if result is None:
                continue
            times = best.get(name, {}).get("rounds", []) + [result[key]]
            if name not in best or result[key] < best[name][key]:
                best[name] = result
            best[name]["rounds"] = times
    return {name: best[name] for name in names if name in best}


def attnmt(*args: str) -> list[str]:
    """The ``attnmt`` command line in this interpreter."""
    return [sys.executable, "-m", "attnmt", *map(str, args)]


def torchrun(*args: str) -> list[str]:
    """``torchrun --nproc_per_node 2 -m attnmt ARGS`` in this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "attnmt", *map(str, args)]


def translate_cmd(model: Path, src: Path, out: Path, beam: int = 5, batch: int = 128, threads: int = 2,
                  **options) -> list[str]:
    """``attnmt translate`` of a file; ``options`` become ``--name value`` (``_`` -> ``-``; True: a bare flag)."""
    cmd = attnmt("translate", "--model", model, "--input", src, "--output", out, "--beam-size", beam,
                 "--batch-size", batch, "--threads", threads)
    for name, value in ((n, v) for n, v in options.items() if v is not None and v is not False):
        cmd += ["--" + name.replace("_", "-")] + ([] if value is True else [str(value)])
    return cmd


def decode_seconds(output: str) -> float:
    """The decode seconds of ``attnmt translate``'s log line ("translated N lines in S s")."""
    m = TRANSLATED.search(output)
    return float(m.group(2)) if m else float("nan")


def translate(model: Path, src: Path, out: Path, env: dict | None = None, **options) -> dict:
    """``attnmt translate`` as a whole process: process and decode seconds, peak RSS, output path."""
    p = run(translate_cmd(model, src, out, **options), env=env)
    return {"seconds": p.seconds, "decode_seconds": decode_seconds(p.output), "peak_rss": p.peak_rss, "output": out}


def bleu(hyp: Path, ref: Path, limit: int | None = None) -> tuple[float, float]:
    """sacreBLEU and chrF of a hypothesis file against a reference file (first ``limit`` lines)."""
    import sacrebleu

    refs = read_lines(ref, limit)
    hyps = read_lines(hyp)[:len(refs)]
    return (round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2), round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2))


def machine() -> dict:
    """The CPU as ``lscpu`` names it: vendor, family, model, the flags that choose kernels, cores."""
    try:
        info = json.loads(subprocess.run(["lscpu", "--json"], capture_output=True, text=True).stdout)
        fields = {e["field"].rstrip(":"): e["data"] for e in info["lscpu"]}
    except (OSError, ValueError, KeyError):
        fields = {}
    flags = set(fields.get("Flags", "").split())
    desc = {"vendor": fields.get("Vendor ID", ""), "family": fields.get("CPU family", ""),
            "model": fields.get("Model", ""), "model_name": fields.get("Model name", ""),
            "flags": [f for f in FLAGS if f in flags], "cores": psutil.cpu_count(logical=True)}
    desc["label"] = machine_label(desc)
    return desc


def machine_label(m: dict) -> str:
    """A short name for a machine description, as RESULTS.md's tables show it."""
    if m.get("label"):
        return m["label"]
    kind = "bf16" if "avx512_bf16" in m.get("flags", []) else "AVX2"
    vendor = "EPYC" if "AMD" in m.get("vendor", "") + m.get("model_name", "") else m.get("vendor", "CPU")
    return f"{vendor} {kind} (fam {m.get('family')} model {m.get('model')})"


def commit() -> str:
    """The checkout's short commit ('+' if it has uncommitted changes), or '' outside git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def record(args, suite: str, section: str, figure: str, value, unit: str = "", **extra) -> dict:
    """Append one figure to ``records/SUITE.jsonl`` (printed instead with ``--no-record`` or ``--smoke``)."""
    rec = {"suite": suite, "section": section, "figure": figure, "value": value, "unit": unit,
           "machine": args.machine, "date": dt.date.today().isoformat(), "commit": args.commit,
           "command": args.command, **extra}
    line = json.dumps(rec, ensure_ascii=False)
    if args.no_record or args.smoke:
        print(line, flush=True)
    else:
        RECORDS.mkdir(exist_ok=True)
        with open(RECORDS / f"{suite}.jsonl", "a", encoding="utf-8") as f:
            f.write(line + "\n")
    return rec


def small_config(args, work: Path, train_lines: int = 2000, valid_lines: int = 100, d_model: int = 32,
                 layers: int = 1, steps: int = 20, vocab: int = 500, **train) -> Path:
    """A de-en configuration on a slice of Multi30k with a small model, written into ``work``:
    the size of smoke runs and of the slow tests."""
    import yaml

    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, limit in (("train", train_lines), ("val", valid_lines)):
        for lang in ("de", "en"):
            files[split, lang] = str(write_lines(work / f"{split}.{lang}", read_lines(corpus(args, split, lang), limit)))
    config = {
        "data": {"pair": "de-en", "train_src": files["train", "de"], "train_tgt": files["train", "en"],
                 "valid_src": files["val", "de"], "valid_tgt": files["val", "en"]},
        "tokenizer": {"vocab_size": vocab, "model_type": "unigram"},
        "model": {"d_model": d_model, "num_heads": 4, "d_ff": 2 * d_model, "num_encoder_layers": layers,
                  "num_decoder_layers": layers, "dropout": 0.1},
        "train": {"batch_tokens": 1500, "max_steps": steps, "valid_every": steps, "log_every": 5, "warmup_steps": 40,
                  "precision": "fp32", "num_threads": 1, "seed": 1, **train},
        "decode": {"max_len_b": 10, "early_stopping": True},
    }
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def smoke_model(args) -> Path:
    """A de-en model of a few updates for ``--smoke`` runs, trained once into the work folder."""
    run_dir = args.work / "smoke" / "model"
    if not (run_dir / "model.safetensors").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        run(attnmt("train", small_config(args, args.work / "smoke"), "--output", run_dir))
    return run_dir


def evaluate(model: Path, src: Path, ref: Path, *options) -> dict:
    """``attnmt evaluate --json`` of a model on a source and reference file: its scores (BLEU, chrF, ...)."""
    p = run(attnmt("evaluate", "--model", model, "--src", src, "--ref", ref, "--json", *options))
    return json.loads([line for line in p.output.splitlines() if line.startswith("{")][-1])
