"""What every suite shares: the data option, running a process, alternating rounds, the machine,
records, reading corpora, training and evaluating with attnmt, and ``attnmt translate``'s command line.

- :func:`add_common` gives a suite's parser ``--data`` (default ``$ATTNMT_DATA``, the folder
  holding ``multi30k/``), ``--smoke`` (seconds-sized run), ``--work``, ``--records`` and ``--no-record``;
  :func:`resolve_data` finds Multi30k as attnmt does (the folder, or attnmt's cache or a download).
- :func:`run` starts a command and measures it: wall seconds and the peak of the summed resident
  memory of its whole process tree, sampled with psutil every 0.1 s.
- :func:`alternate` times several jobs in rounds whose order reverses every round (A B C, then
  C B A, ...), so that a machine's drift hits every job alike, and keeps each job's fastest round.
- :func:`machine`, :func:`commit`, :func:`load_per_core`: the CPU, the checkout and the load (host.py).
- :func:`record` stores one figure (records.py) in ``benchmarks/records/SUITE.jsonl``, replacing the
  record of the same key: figure, value, unit, machine, date, commit and the exact command line.
- :func:`trained`, :func:`train_log`, :func:`evaluate`, :func:`bleu`: attnmt's training (a model trained
  at this clean commit from the same configuration reused, stamps.py), its log,
  ``attnmt evaluate --json`` and its scoring, each in one place; :func:`capped` stops a preset at a
  number of updates; :func:`smoke_model` is the tiny model (:data:`TINY`) of ``--smoke`` runs.
- :class:`BenchError`: a user's mistake, one line on stderr and exit 2 (``__main__``).
"""

from __future__ import annotations

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
from pydantic import ValidationError

from host import BUSY, busy_line, commit, load_per_core, machine  # noqa: F401 (the suites' names)
from records import Record, store
from stamps import STAMP, atomic_json, note_model, reusable, stamp  # noqa: F401

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RECORDS = HERE / "records"
WORK = HERE / "work"
POLL_S = 0.1
TRANSLATED = re.compile(r"translated (\d+) lines in ([\d.]+) s")


class BenchError(Exception):
    """A user's mistake (an option, a data folder, a records file): the driver prints it as one line, exit 2."""


def add_common(parser) -> None:
    """The options every suite has."""
    parser.add_argument("--data", type=Path, default=os.environ.get("ATTNMT_DATA"),
                        help="the folder holding multi30k/ (default $ATTNMT_DATA; without either, attnmt's dataset "
                             "registry: its cache, or a download)")
    parser.add_argument("--smoke", action="store_true", help="a seconds-sized run that checks the suite works "
                        "(prints its records, stores none)")
    parser.add_argument("--work", type=Path, default=WORK, help="work folder (default benchmarks/work)")
    parser.add_argument("--records", type=Path, default=RECORDS, help="records folder (default benchmarks/records)")
    parser.add_argument("--no-record", action="store_true", help="print the records instead of storing them")
    parser.add_argument("--allow-dirty", action="store_true", help="store records although the tree has uncommitted "
                        "changes (each marked dirty); without it such a run is refused before it starts")


def resolve_data(args) -> Path:
    """The folder holding ``multi30k/`` for ``--data`` (or ``$ATTNMT_DATA``), else attnmt's cache of the
    Multi30k download (attnmt.data.corpus.dataset_file: the cache, or a download).

    Raises:
        BenchError: ``--data`` missing or without ``multi30k/``; the download failed (offline).
    """
    from attnmt.data.corpus import dataset_file
    from attnmt.errors import DataError, NetworkFailure

    if args.data is not None and not Path(args.data).is_dir():
        raise BenchError(f"--data {args.data}: no such folder (the folder holding multi30k/, or ATTNMT_DATA)")
    if args.data is not None and not (Path(args.data) / "multi30k").is_dir():
        raise BenchError(f"--data {args.data}: no folder multi30k/ in it (the folder holding multi30k/, or ATTNMT_DATA)")
    try:
        files = [dataset_file("multi30k", split, lang, args.data) for split in ("train", "val", "test_2016_flickr")
                 for lang in ("de", "en")]
    except (DataError, NetworkFailure) as e:
        raise BenchError(f"no Multi30k (give --data DIR or set ATTNMT_DATA, the folder holding multi30k/): {e}") from None
    return files[0].parents[1]


def corpus(args, split: str, lang: str) -> Path:
    """``DATA/multi30k/SPLIT.LANG.gz`` of the resolved data folder (:func:`resolve_data`)."""
    path = Path(args.data) / "multi30k" / f"{split}.{lang}.gz"
    if not path.is_file():
        raise BenchError(f"--data {args.data}: no file multi30k/{split}.{lang}.gz")
    return path


def model_dir(path: Path | None, option: str = "--model") -> Path:
    """``path`` if it names a model directory (or a preset's ``.yaml``); else :class:`BenchError`."""
    if path is None:
        raise BenchError(f"{option} is required for this part")
    if not (Path(path).is_dir() or (Path(path).suffix == ".yaml" and Path(path).is_file())):
        raise BenchError(f"{option} {path}: no such model directory")
    return Path(path)


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


def torchrun_cmd(*args: str) -> list[str]:
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


def bleu(hyp: Path, ref: Path, limit: int | None = None) -> dict:
    """sacreBLEU's BLEU and chrF of a hypothesis file against a reference file (its first ``limit`` lines),
    as ``attnmt evaluate`` scores them (attnmt.evaluate.corpus_scores)."""
    from attnmt.evaluate import corpus_scores

    refs = read_lines(ref, limit)
    return corpus_scores(read_lines(hyp)[:len(refs)], refs)


def record(args, section: str, figure: str, column: str, value, unit: str, **settings) -> dict:
    """Store one figure in ``--records``/SUITE.jsonl (printed instead with ``--no-record`` or ``--smoke``),
    replacing the record of the same section, figure, column and machine; ``settings`` are those not in
    the command; its date is the run's start (``args.date``). The record is validated (records.Record) first."""
    models = getattr(args, "models", None)
    if models:  # the trained models this run read, each reused or trained now (see trained)
        settings = {**settings, "models": list(models.values())}
    rec = {"suite": args.suite, "section": section, "figure": figure, "column": column, "value": value, "unit": unit,
           "machine": args.machine, "date": args.date, "load": getattr(args, "load", None),
           "commit": args.commit, "dirty": args.dirty, "command": args.command, **({"settings": settings} if settings else {})}
    if rec["load"] is None:
        del rec["load"]
    try:
        Record.model_validate(rec)
    except ValidationError as e:
        raise BenchError(f"{section} / {figure} / {column}: not a record ({e.errors()[0]['msg']}: "
                         f"{e.errors()[0]['loc']})") from None
    if args.no_record or args.smoke:
        print(json.dumps(rec, ensure_ascii=False), flush=True)
    else:
        store(Path(args.records), rec)
    return rec


TINY = {"model": {"d_model": 32, "num_heads": 4, "d_ff": 64, "num_encoder_layers": 1, "num_decoder_layers": 1},
        "tokenizer": {"vocab_size": 500}}  # the smoke runs' model


def tiny_sets() -> list[str]:
    """:data:`TINY` as ``KEY=VALUE`` settings (``--set`` or attnmt.config.apply_overrides)."""
    return [f"{section}.{key}={value}" for section, values in TINY.items() for key, value in values.items()]


def capped(updates: int) -> list[str]:
    """The settings that stop a preset after ``updates`` updates, whatever the machine's speed: its
    time budget (600 minutes) never ends first, and the time-budget schedule fits itself to the cap."""
    return [f"train.max_steps={updates}", "train.max_minutes=600"]


def schedule_sets(schedule: str) -> dict[str, str]:
    """``--set`` settings that switch a preset to the learning-rate ``schedule``: that, and each
    train key that applies only to other schedules put back to its default, since the
    configuration refuses a key set for a schedule not in use (a preset sets ``train.lr`` and
    ``train.budget_decay`` for its ``time_budget``). Later settings may set them again."""
    from attnmt.config.rules import APPLIES_ONLY_TO
    from attnmt.config.schema import TrainConfig

    sets = {"train.schedule": schedule}
    for (section, key), (_, option, values) in APPLIES_ONLY_TO.items():
        if section == "train" and option == "schedule" and schedule not in values:
            sets[f"train.{key}"] = str(TrainConfig.model_fields[key].default)
    return sets


def set_args(settings: list[str]) -> list[str]:
    """``KEY=VALUE`` settings as ``--set`` arguments."""
    return [x for item in settings for x in ("--set", item)]


def train_log(run_dir: Path) -> list[dict]:
    """The records of a run's ``train_log.jsonl`` (attnmt train's log), in order."""
    path = Path(run_dir) / "train_log.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def last(logged: list[dict], kind: str, key: str | None = None):
    """The last log record of ``kind`` (its ``key`` if given); None when there is none."""
    found = [r for r in logged if r["kind"] == kind]
    return (found[-1][key] if key else found[-1]) if found else None


def trained(args, config: Path, run_dir: Path, *options, env: dict | None = None, torchrun: bool = False,
            fresh: bool = False) -> list[dict]:
    """``attnmt train CONFIG OPTIONS`` into ``run_dir`` (``torchrun``: 2 processes; ``fresh``: from scratch): its
    log records (:func:`train_log`). A finished run trained from the same configuration and options at this
    same clean commit (its stamp, :func:`stamp`) is reused as it is; an unfinished one of that stamp is
    resumed; any other is trained again from scratch. Every record of the run names the model (:func:`note_model`)."""
    wanted, path = stamp(args, config, options), Path(run_dir) / STAMP
    if reusable(run_dir, wanted) and not fresh:
        print(f"[bench] reusing {run_dir}: trained to its end from the same configuration at this commit", flush=True)
        note_model(args, run_dir, reused=True)
        return train_log(run_dir)
    have = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    if fresh or have != wanted or wanted["dirty"]:  # another configuration or commit, or code no commit holds
        shutil.rmtree(run_dir, ignore_errors=True)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    atomic_json(path, wanted)  # first: an interrupted run of this stamp resumes
    resume = ["--resume"] if (Path(run_dir) / "checkpoints" / "last.pt").exists() else []
    run((torchrun_cmd if torchrun else attnmt)("train", config, "--output", run_dir, "--data-dir", args.data,
                                               *options, *resume), env=env)
    note_model(args, run_dir, reused=False)
    return train_log(run_dir)


def small_config(args, work: Path, train_lines: int = 2000, valid_lines: int = 100, steps: int = 20, **train) -> Path:
    """A de-en configuration of the :data:`TINY` model on a slice of Multi30k, written into ``work``:
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
        "tokenizer": {**TINY["tokenizer"], "model_type": "unigram"},
        "model": {**TINY["model"], "dropout": 0.1},
        "train": {"batch_tokens": 1500, "max_steps": steps, "valid_every": steps, "log_every": 5, "warmup_steps": 40,
                  "precision": "fp32", "num_threads": 1, "seed": 1, **train},
        "decode": {"max_len_b": 10, "early_stopping": True},
    }
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def smoke_model(args) -> Path:
    """The :data:`TINY` de-en model of a few updates for ``--smoke`` runs, trained once into the work folder."""
    run_dir = args.work / "smoke" / "model"
    if not (run_dir / "model.safetensors").exists():
        trained(args, small_config(args, args.work / "smoke"), run_dir, fresh=True)
    return run_dir


def evaluate(model: Path, src: Path, ref: Path, *options) -> dict:
    """``attnmt evaluate --json`` of a model on a source and reference file: its scores (BLEU, chrF, ...)."""
    p = run(attnmt("evaluate", "--model", model, "--src", src, "--ref", ref, "--json", *options))
    return json.loads([line for line in p.output.splitlines() if line.startswith("{")][-1])
