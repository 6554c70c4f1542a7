"""``precision: auto``: float32 or bfloat16 chosen by timing the job's own work on this CPU.

Whether a CPU has bfloat16 kernels (``attnmt.precision.cpu_bf16_is_fast``) says what it can run,
not what runs faster: on some CPUs with AVX-512 BF16 the bfloat16 training step is faster than
float32, on others slower (benchmarks/RESULTS.md). So ``auto`` times a few steps of the job
itself (training: forward and backward passes of the model on real batches,
``attnmt.train.calibration``; translation: searches of the model, ``attnmt.decode.calibration``)
in each precision and keeps the faster:

- :func:`measure` alternates the precisions batch by batch (fp32 then bf16, then bf16 then
  fp32, ...) after one untimed warm-up step each, so that a drift of a shared machine's load
  hits both alike: at least :data:`MIN_TIMED` rounds, then more while the timed work is under
  :data:`MAX_SECONDS` and a batch is left untimed; the rate is tokens per second of wall clock.
- :func:`decide`: bf16 wins only when it is faster than fp32 by more than :data:`MARGIN`; a
  tie within the margin goes to fp32, the exact arithmetic.
- int8 is never a candidate: it changes the translations, not only their speed.
- A CPU without bfloat16 kernels is not timed (bfloat16 runs there far slower): fp32.

The outcome is cached per CPU model (:func:`cpu_identity`: model name, family, model, flags) and
per job shape (the caller's signature: the model's sizes, the batch size, the thread count), in
``$XDG_CACHE_HOME/attnmt/precision.json`` (default ``~/.cache/attnmt/``; another file with
``ATTNMT_PRECISION_CACHE``), written atomically; a
later job of the same shape on the same CPU model reads it and times nothing. A cache file that
cannot be read (corrupt, or of another layout) is ignored with a warning and written anew.

Library: torch (the thread count and version of the key), the standard library's JSON.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from attnmt import environment
from attnmt import precision as precisions
from attnmt.atomic import atomic_write

log = logging.getLogger(__name__)

CANDIDATES = ("fp32", "bf16")  # int8 changes translations: never chosen for speed
MARGIN = 0.05  # bf16 must be more than 5% faster than fp32 to be chosen; ties go to fp32
MIN_TIMED = 2  # timed steps per precision, at least
MAX_SECONDS = 12.0  # timed work of all precisions together, beyond the minimum steps
CACHE_NAME = "precision.json"
CACHE_LAYOUT = 1  # the cache file's layout; another one is ignored


@dataclass
class Choice:
    """A precision chosen for ``auto``.

    precision: 'fp32' or 'bf16'; rates: target (training) or output (translation) tokens per
    second of each precision timed; how: 'measured', 'cache' (timed by an earlier job),
    'run' (the run's own earlier choice, on resume) or 'no bf16' (a CPU without bfloat16
    kernels, not timed); seconds: wall-clock seconds the timing took (0 when nothing was timed).
    """

    precision: str
    rates: dict[str, float] = field(default_factory=dict)
    how: str = "measured"
    seconds: float = 0.0

    def line(self) -> str:
        """The log line: 'precision auto: fp32 3,520 tok/s, bf16 2,150 tok/s -> fp32' (and where
        the rates come from when they were not timed now)."""
        rates = ", ".join(f"{p} {r:,.0f} tok/s" for p, r in self.rates.items())
        line = f"precision auto: {rates or self.how} -> {self.precision}"
        if self.how == "cache":
            return f"{line} (timed before on this CPU model; {cache_file()})"
        if self.how == "run":
            return f"{line} (the run's own choice)"
        return line

    def record(self) -> dict:
        """The choice as a JSON-ready dict (what a run directory keeps): also the CPU."""
        return {**asdict(self), "cpu": cpu_identity()}


def decide(rates: dict[str, float], margin: float = MARGIN) -> str:
    """'bf16' if ``rates['bf16'] > rates['fp32'] * (1 + margin)``, else 'fp32' (ties and
    missing rates go to fp32)."""
    if "bf16" in rates and rates["bf16"] > rates.get("fp32", 0.0) * (1.0 + margin):
        return "bf16"
    return "fp32"


def measure(step: Callable[[str, int], int], count: int, precisions: tuple[str, ...] = CANDIDATES,
            clock: Callable[[], float] = time.perf_counter, max_seconds: float = MAX_SECONDS,
            min_timed: int = MIN_TIMED) -> dict[str, float]:
    """Tokens per second of each precision (module docstring).

    Args:
        step: ``step(precision, i)`` does the job's work on its batch ``i`` (0 <= i < count) at
            ``precision`` and returns the tokens it handled; batch 0 is the untimed warm-up.
        count: the batches there are (at least 2); timed batches cycle through 1 .. count - 1.
        clock: seconds (``time.perf_counter``; a fake one in tests).
    Returns:
        {precision: tokens / second} in the order of ``precisions``.
    """
    for p in precisions:
        step(p, 0)  # warm-up: first-call allocations and kernel choices stay out of the rate
    tokens = dict.fromkeys(precisions, 0)
    seconds = dict.fromkeys(precisions, 0.0)
    k = 0
    while k < min_timed or sum(seconds.values()) < max_seconds:
        i = 1 + k % max(count - 1, 1)
        order = precisions if k % 2 == 0 else precisions[::-1]  # alternate which precision goes first
        for p in order:
            start = clock()
            tokens[p] += step(p, i)
            seconds[p] += clock() - start
        k += 1
        if k >= min_timed and k >= count - 1:  # every batch timed once: enough
            break
    return {p: tokens[p] / max(seconds[p], 1e-9) for p in precisions}


def cpu_identity() -> str:
    """The CPU model, as Linux's /proc/cpuinfo names it: 'model name | family F model M | flags
    HASH' (a hash of every flag, so that a CPU model exposing other instructions, e.g. AMX in
    one virtual machine and not in another, is another key); elsewhere ``platform.processor()``."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    if not fields:
        return f"{platform.processor() or platform.machine()} | {platform.system()}"
    flags = hashlib.sha256(" ".join(sorted(fields.get("flags", "").split())).encode()).hexdigest()[:12]
    return f"{fields.get('model name', '?')} | family {fields.get('cpu family', '?')} model " \
           f"{fields.get('model', '?')} | flags {flags}"


def cache_file() -> Path:
    """``$ATTNMT_PRECISION_CACHE`` if set, else ``$XDG_CACHE_HOME/attnmt/precision.json``
    (default ``~/.cache/attnmt/precision.json``)."""
    chosen = environment.path(environment.PRECISION_CACHE)
    if chosen:
        return Path(chosen)
    return environment.cache_home() / "attnmt" / CACHE_NAME


def cache_key(job: str, shapes: str) -> str:
    """The cache's key of a job: the job, its shapes, the CPU model, the thread count and torch's
    version (another oneDNN may rank the precisions otherwise)."""
    return f"{job} | {shapes} | {cpu_identity()} | threads {torch.get_num_threads()} | torch {torch.__version__}"


def read_cache(path: Path) -> dict[str, dict]:
    """The cache's entries by key; {} for a missing file, and for an unreadable one with a warning."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as e:
        log.warning("%s: cannot read the precision cache (%s); timing again", path, e.strerror)
        return {}
    try:
        data = json.loads(text)
        if data.get("layout") != CACHE_LAYOUT or not isinstance(data.get("entries"), dict):
            raise ValueError("not a precision cache of this attnmt")
        entries = data["entries"]
        for entry in entries.values():
            if entry.get("precision") not in CANDIDATES or not isinstance(entry.get("rates"), dict):
                raise ValueError("an entry without a precision or rates")
        return entries
    except (ValueError, AttributeError) as e:
        log.warning("%s: not a readable precision cache (%s); ignored, timing again", path, e)
        return {}


def write_cache(path: Path, key: str, choice: Choice) -> None:
    """Add (or replace) one entry, atomically; a cache that cannot be written is only a warning."""
    entries = read_cache(path)
    entries[key] = {"precision": choice.precision, "rates": choice.rates,
                    "date": time.strftime("%Y-%m-%d", time.gmtime())}
    text = json.dumps({"layout": CACHE_LAYOUT, "entries": entries}, indent=1, sort_keys=True) + "\n"
    try:
        atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    except OSError as e:  # WriteError is an OSError too
        log.warning("%s: cannot write the precision cache (%s)", path, e)


def choose(job: str, shapes: str, step: Callable[[str, int], int], count: int) -> Choice:
    """The precision of an ``auto`` job on this CPU: 'fp32' without bfloat16 kernels, else the
    cached choice of this job shape and CPU model, else :func:`measure` then :func:`decide`
    (cached). Logs :meth:`Choice.line`.

    Args:
        job: 'train' or 'translate'; shapes: the job's shape signature (part of the cache key).
        step, count: as :func:`measure` takes them.
    """
    if not precisions.cpu_bf16_is_fast():
        choice = Choice("fp32", how="this CPU has no bfloat16 kernels")
        log.info("%s", choice.line())
        return choice
    key = cache_key(job, shapes)
    path = cache_file()
    cached = read_cache(path).get(key)
    if cached is not None:
        rates = {p: float(cached["rates"][p]) for p in CANDIDATES if p in cached["rates"]}
        choice = Choice(cached["precision"], rates, how="cache")
    else:
        started = time.perf_counter()
        rates = {p: round(r, 1) for p, r in measure(step, count).items()}
        choice = Choice(decide(rates), rates, how="measured", seconds=time.perf_counter() - started)
        write_cache(path, key, choice)
    log.info("%s", choice.line())
    return choice
