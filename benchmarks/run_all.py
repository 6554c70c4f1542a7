"""``python -m benchmarks all``: every step of the record (plan.py) in its fixed order, on the machine at hand.

Before anything runs: the plan with each step's estimated minutes (``--dry-run`` stops there), a
refusal when the tree has uncommitted changes (``--allow-dirty`` measures anyway and every record says
``dirty``), a line when the machine is busy (load average above 0.5 per core), and the peers' virtual
environments made by ``setup_peers.sh`` when the ``peers`` step will run and one is missing. Then
each step runs, after the first once the load average has fallen back (:func:`settle`), as its own ``python -m benchmarks ...`` process, so that its records name the command
that reruns it alone; a training step whose model is already trained from the same configuration at
this clean commit reuses it (harness.trained). A step that fails is reported and the next one runs;
the exit status is 1 when any failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import harness as h
import plan

SETTLE_SECONDS = 180  # the most ``settle`` waits before a step


def add_arguments(p) -> None:
    p.add_argument("--step", action="append", default=[], metavar="NAME",
                   help="run only this step (repeatable); names: " + ", ".join(s.name for s in plan.STEPS))
    p.add_argument("--skip-trainings", action="store_true", help="only the parts (the models must exist)")
    p.add_argument("--dry-run", "--plan", action="store_true", help="print the steps and their estimated minutes")
    p.add_argument("--allow-dirty", action="store_true", help="measure a tree with uncommitted changes (records say dirty)")
    p.add_argument("--data", default=os.environ.get("ATTNMT_DATA"), help="the folder holding multi30k/ "
                   "(default $ATTNMT_DATA), given to every step as ATTNMT_DATA")


def steps(args) -> list[plan.Step]:
    """The steps the options pick, in the plan's order."""
    try:
        chosen = plan.select(args.step)
    except KeyError as e:
        raise h.BenchError(f"--step {e.args[0]}: no such step (one of {', '.join(s.name for s in plan.STEPS)})") from None
    return [s for s in chosen if not (args.skip_trainings and s.kind == "training")]


def missing_peers() -> list[str]:
    """The peers whose environment setup_peers.sh has not finished (no ``.ready`` marker)."""
    return [name for name in ("joeynmt", "onmt", "eole") if not (h.WORK / f"venv-{name}" / ".ready").is_file()]


def missing_models(chosen: list[plan.Step]) -> list[str]:
    """Lines naming the models a step needs that neither exist nor come from an earlier chosen step."""
    made = set()
    out = []
    for s in chosen:
        for need in s.needs:
            if need not in made and not (h.ROOT / need / "model.safetensors").is_file():
                maker = next((t.name for t in plan.STEPS if t.writes == need), "?")
                out.append(f"step {s.name} needs {need}: run its training first (python -m benchmarks all --step {maker})")
        if s.writes:
            made.add(s.writes)
    return out


def settle(limit: float = SETTLE_SECONDS, poll: float = 5.0) -> float:
    """Wait until the 1-minute load average is at most ``h.BUSY`` per core, at most ``limit``
    seconds; the seconds waited. The average still holds the previous step's processes for a
    minute or two after they end (it decays by e each minute), so without the wait the next
    step's records would keep a load that no process of the machine made any more."""
    t0 = time.monotonic()
    while h.load_per_core() > h.BUSY and time.monotonic() - t0 < limit:
        time.sleep(poll)
    waited = time.monotonic() - t0
    if waited >= poll:
        print(f"[all] waited {waited:.0f} s for the load average to settle ({h.load_per_core():.2f} per core)",
              flush=True)
    return waited


def run(args) -> None:
    """Print the plan, check the tree and the machine, then run each step; exit 1 if a step failed."""
    chosen = steps(args)
    for line in plan.listing(chosen):
        print(line, flush=True)
    if args.dry_run:
        return
    commit, dirty = h.commit()
    if dirty and not args.allow_dirty:
        raise h.BenchError("the tree has uncommitted changes: commit them (records name a clean commit), or measure "
                           "anyway with --allow-dirty")
    problems = missing_models(chosen)
    if problems:
        raise h.BenchError("; ".join(problems))
    busy = h.busy_line(h.load_per_core())
    if busy:
        print(busy, flush=True)
    env = dict(os.environ, **({"ATTNMT_DATA": str(args.data)} if args.data else {}))
    if any(s.name == "peers" for s in chosen) and missing_peers():
        subprocess.run(["bash", str(h.HERE / "setup_peers.sh"), *missing_peers()], cwd=h.ROOT, env=env, check=False)
    failed, start = [], time.perf_counter()
    print(f"[all] commit {commit}{' (dirty)' if dirty else ''}; {len(chosen)} steps", flush=True)
    for k, s in enumerate(chosen):
        if k:
            settle()
        cmd = [sys.executable, "-m", "benchmarks", *s.argv, *(["--allow-dirty"] if args.allow_dirty else [])]
        print(f"[all] step {s.name} ({s.kind}, about {s.minutes:.0f} min): {s.command()}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.run(cmd, cwd=h.ROOT, env=env).returncode
        print(f"[all] step {s.name}: {'done' if code == 0 else f'FAILED ({code})'} in "
              f"{(time.perf_counter() - t0) / 60:.1f} min (estimated {s.minutes:.0f})", flush=True)
        if code:
            failed.append(s.name)
    print(f"[all] {len(chosen) - len(failed)} of {len(chosen)} steps in {(time.perf_counter() - start) / 60:.1f} min; "
          "then: python -m benchmarks report", flush=True)
    if failed:
        print(f"[all] failed: {', '.join(failed)}", file=sys.stderr, flush=True)
        sys.exit(1)
