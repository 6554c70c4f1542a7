"""The benchmark driver: ``python -m benchmarks SUITE [--smoke] [options]`` and ``python -m benchmarks report``.

Suites (``python -m benchmarks SUITE --help`` lists each one's options):

- ``train``: the peers' training throughput and translation in the shared setting, the compiled step
- ``translate``: attnmt's engines, stopping rules, CTranslate2 called directly
- ``serve``: ``attnmt serve`` under load (``--driver httpx`` or ``wrk``)
- ``web``: the exported page in headless Chromium against native translation
- ``data``: ``attnmt prepare`` and training at K copies of Multi30k, the simulated 100M-pair corpus
- ``quality``: presets, multilingual, distillation, the fast preset, fine-tuning, control of the output

Each suite appends its figures to ``records/SUITE.jsonl``; ``report`` rebuilds RESULTS.md from them.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import results  # noqa: E402

SUITES = ("train", "translate", "serve", "web", "data", "quality")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="suite", required=True)
    modules = {}
    for name in SUITES:
        modules[name] = importlib.import_module(f"suite_{name}")
        p = sub.add_parser(name, help=modules[name].__doc__.splitlines()[0], description=modules[name].__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        harness.add_common(p)
        modules[name].add_arguments(p)
    sub.add_parser("report", help="rebuild RESULTS.md from records/*.jsonl").add_argument(
        "--check", action="store_true", help="exit 1 if RESULTS.md differs from the records")
    args = parser.parse_args(argv)
    if args.suite == "report":
        results.report(args)
        return
    args.machine, args.commit = harness.machine(), harness.commit()
    args.command = shlex.join(["python", "-m", "benchmarks", *argv])
    args.work.mkdir(parents=True, exist_ok=True)
    modules[args.suite].run(args)


if __name__ == "__main__":
    main()
