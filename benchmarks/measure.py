"""Running one command and measuring it: wall seconds, peak resident memory, others' CPU load.

:func:`run` starts a command, polls the summed VmRSS of its process tree every 0.1 s and, from
/proc/stat, the CPU time that processes outside the benchmark spent meanwhile (a run that
shared the machine is flagged in RESULTS.md). Linux only (/proc); standard library only.
"""

from __future__ import annotations

import os
import resource
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

RSS_POLL_S = 0.1  # seconds between two samples of the process tree's resident memory


def _children() -> dict[int, list[int]]:
    """Parent pid -> the pids of its children, for every process in /proc."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def tree_rss_bytes(pid: int) -> int:
    """Summed resident memory (VmRSS) of ``pid`` and all its descendants, in bytes."""
    kids, todo, total = _children(), [pid], 0
    while todo:
        p = todo.pop()
        todo.extend(kids.get(p, []))
        try:
            with open(f"/proc/{p}/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (all cores, from /proc/stat)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and its reaped descendants."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def idle_other_cores(seconds: float = 2.0) -> float:
    """Mean CPU cores that processes outside the benchmark keep busy over ``seconds`` of sleep."""
    busy0, own0 = busy_cpu_seconds(), own_cpu_seconds()
    time.sleep(seconds)
    return max(0.0, busy_cpu_seconds() - busy0 - (own_cpu_seconds() - own0)) / seconds


@dataclass
class Proc:
    """One finished command: wall seconds, peak tree RSS (bytes), exit status, log file."""

    cmd: list[str]
    seconds: float
    peak_rss: int
    returncode: int
    log: Path
    stdout: str = ""
    other_cores: float = 0.0  # mean CPU cores used by processes outside the benchmark meanwhile


def run(cmd: list[str], log: Path, env: dict | None = None, stdin: Path | None = None, cwd: Path | None = None,
        nice: int = 0, capture_stdout: bool = False, stdout_file: Path | None = None) -> Proc:
    """Run ``cmd``, stderr (and stdout unless captured or sent to ``stdout_file``) to ``log``;
    wall seconds and peak tree RSS. Raises RuntimeError (with the log's tail) on a non-zero exit."""
    full_env = dict(os.environ, **(env or {}))
    if nice:
        cmd = ["nice", "-n", str(nice)] + cmd
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[bench] $ {shlex.join(cmd)}" + (f" < {stdin}" if stdin else ""), flush=True)
    with open(log, "w", encoding="utf-8") as logf:
        logf.write(f"$ {shlex.join(cmd)}\n")
        logf.flush()
        fin = open(stdin, "rb") if stdin else subprocess.DEVNULL
        fout = open(stdout_file, "wb") if stdout_file else subprocess.PIPE if capture_stdout else logf
        busy0, own0 = busy_cpu_seconds(), own_cpu_seconds()
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fout, stderr=logf, stdin=fin, env=full_env, cwd=cwd)
        peak = 0
        stop = threading.Event()

        def poll() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, tree_rss_bytes(p.pid))
                stop.wait(RSS_POLL_S)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        out = p.communicate()[0] if capture_stdout else None
        p.wait()
        seconds = time.perf_counter() - t0
        stop.set()
        poller.join()
        other = max(0.0, (busy_cpu_seconds() - busy0) - (own_cpu_seconds() - own0)) / max(seconds, 1e-9)
        if stdin:
            fin.close()
        if stdout_file:
            fout.close()
    result = Proc(cmd, seconds, peak, p.returncode, log, out.decode("utf-8", "replace") if out else "", other)
    print(f"[bench]   -> rc {p.returncode}, {seconds:.1f} s, peak RSS {peak / 2**30:.2f} GiB, "
          f"other processes {other:.2f} cores", flush=True)
    if p.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise RuntimeError(f"command failed (rc {p.returncode}): {shlex.join(cmd)}\n  log {log}:\n    "
                           + "\n    ".join(tail))
    return result
