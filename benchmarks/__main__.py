"""The benchmark driver: ``python -m benchmarks SUITE [--smoke] [options]``, ``python -m benchmarks all`` (every
suite and part in a fixed order, plan.py; ``--dry-run`` lists the steps and their estimated minutes) and
``python -m benchmarks report``.

Suites (``python -m benchmarks SUITE --help`` lists each one's options):

- ``train``: the peers' training throughput and translation in the shared setting, the compiled step, torchrun
- ``translate``: attnmt's engines, stopping rules, CTranslate2 called directly
- ``serve``: ``attnmt serve`` under load (``--driver httpx`` or ``wrk``)
- ``web``: the exported page in headless Chromium against native translation
- ``data``: ``attnmt prepare`` and training at K copies of Multi30k, the simulated 100M-pair corpus
- ``quality``: presets, multilingual, distillation, the fast preset, recipes, fine-tuning, control of the output

Each suite stores its figures in ``records/SUITE.jsonl``; ``report`` rebuilds RESULTS.md from them.
A mistake in the options, the data folder or a records file is one line on stderr, exit 2; so is a run that would
store records from a tree with uncommitted changes without ``--allow-dirty``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attnmt import ranges  # noqa: E402
from attnmt.cli.options import in_range  # noqa: E402
from attnmt.errors import AttnmtError  # noqa: E402
from attnmt.ranges import C_INT_MAX, Range  # noqa: E402

import harness  # noqa: E402
import records  # noqa: E402
import results  # noqa: E402
import run_all  # noqa: E402

# The suites, each a module suite_NAME with add_arguments(parser), run(args), PARTS (part -> the options that pick
# it), SMOKE (option -> its value at --smoke size; a callable gets the options) and MODELS (options naming a model).
SUITES = {name: importlib.import_module(f"suite_{name}") for name in ("train", "translate", "serve", "web", "data",
                                                                      "quality")}


# The range of each number option of the suites, by its dest: attnmt's own ranges where the option is
# one of attnmt's quantities, else a count from 1 (COUNTS) or the ranges below. A number option missing
# here is refused by the parser's construction (ranged_numbers), so that none reaches a suite unchecked.
SECONDS = Range(0.0, 7 * 24 * 3600.0)
OPTION_RANGES = {
    "beam": ranges.BEAM_SIZE, "beam_size": ranges.BEAM_SIZE, "default_beam": ranges.BEAM_SIZE,
    "batch_size": ranges.BATCH_SIZE, "decode_batch": ranges.BATCH_SIZE, "page_batch": ranges.BATCH_SIZE,
    "threads": ranges.THREADS, "workers": ranges.THREADS, "inter_threads": ranges.THREADS,
    "alpha_exact": ranges.LENGTH_PENALTY, "alpha_early": ranges.LENGTH_PENALTY, "default_alpha": ranges.LENGTH_PENALTY,
    "lr": Range(0.0, 10.0, low_open=True), "finetune_lr": Range(0.0, 10.0, low_open=True),
    "seconds": SECONDS, "tolerance": Range(0.0, 100.0), "seed": Range(0, 2**32 - 1, integer=True),
    "sizes": Range(1.0, 1e12), "test_lines": Range(0, C_INT_MAX, integer=True),
}
COUNTS = Range(1, C_INT_MAX, integer=True)  # sentences, updates, rounds, repeats, copies, tokens, steps, clients


def ranged_numbers(p: argparse.ArgumentParser) -> None:
    """Give every int or float option of ``p`` its range (:data:`OPTION_RANGES`, else :data:`COUNTS`
    for an int), checked as attnmt's own options are (``attnmt.cli.options.in_range``).

    Raises:
        AssertionError: a float option with no range in :data:`OPTION_RANGES` (a bug of the suite).
    """
    for action in p._actions:
        if action.type in (int, float):
            rng = OPTION_RANGES.get(action.dest)
            if rng is None and action.dest == "warmup":
                rng = SECONDS if action.type is float else COUNTS
            assert rng is not None or action.type is int, f"--{action.dest}: a float option needs a range here"
            action.type = in_range(rng or COUNTS)


def parser() -> argparse.ArgumentParser:
    """The driver's command line: a subcommand per suite, and ``report``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="suite", required=True)
    for name, module in SUITES.items():
        s = sub.add_parser(name, help=module.__doc__.splitlines()[0], description=module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        harness.add_common(s)
        module.add_arguments(s)
        ranged_numbers(s)
    a = sub.add_parser("all", help="every suite and part in a fixed order (--dry-run: the plan)",
                       description=run_all.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run_all.add_arguments(a)
    ranged_numbers(a)
    r = sub.add_parser("report", help="rebuild RESULTS.md from the records")
    r.add_argument("--check", action="store_true", help="exit 1 if RESULTS.md differs from the records, or two "
                   "records of one table differ only in a name")
    r.add_argument("--records", type=Path, default=results.RECORDS, help="records folder (default benchmarks/records)")
    r.add_argument("--output", type=Path, default=results.RESULTS, help="default benchmarks/RESULTS.md")
    return p


def prepare(args, module) -> None:
    """Before a suite runs: the records folder readable, the data folder, the models named, the smoke settings."""
    records.load(args.records)
    for name in module.MODELS:
        if getattr(args, name, None) is not None:
            harness.model_dir(getattr(args, name), "--" + name.replace("_", "-"))
    args.data = harness.resolve_data(args)
    args.machine = harness.machine()
    args.commit, args.dirty = harness.commit()
    stores = not (args.smoke or args.no_record)
    if stores and args.dirty and not args.allow_dirty:
        raise harness.BenchError("the tree has uncommitted changes: commit them (records name a clean commit), "
                                 "or store dirty records with --allow-dirty")
    for name in module.MODELS:  # a model a training step made: every record names the commit it was trained at
        value = getattr(args, name, None)
        if value is not None and (Path(value) / harness.STAMP).is_file():
            harness.note_model(args, Path(value), reused=True)
    args.load = harness.load_per_core()  # at the run's start; every record keeps it
    busy = harness.busy_line(args.load)
    if busy:
        print(busy, file=sys.stderr, flush=True)
    args.date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")  # the run's: one for all its records
    if args.smoke:
        args.work.mkdir(parents=True, exist_ok=True)
        for name, value in module.SMOKE.items():
            setattr(args, name, value(args) if callable(value) else value)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    try:
        if args.suite == "report":
            results.report(args)
            return
        if args.suite == "all":
            run_all.run(args)
            return
        module = SUITES[args.suite]
        # --allow-dirty changes nothing measured (the record says dirty): left out of the command it reruns
        args.command = shlex.join(["python", "-m", "benchmarks", *(a for a in argv if a != "--allow-dirty")])
        prepare(args, module)
        args.work.mkdir(parents=True, exist_ok=True)
        module.run(args)
    except (harness.BenchError, records.RecordError, AttnmtError) as e:
        for line in str(e).splitlines():
            print(f"python -m benchmarks {args.suite}: {line}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
