#!/usr/bin/env python3
"""attnmt's benchmark suite: attnmt and its peers side by side, in one run, on one machine.

What it measures (its full report goes to ``--results``, by default benchmarks/work/suite/report.md;
the current figures are copied into benchmarks/RESULTS.md's sections):

1. The machine limit: float32 and bfloat16 2048x2048 matmul GFLOP/s on the benchmark's threads
   (bfloat16 512x512 on a CPU without bfloat16 kernels, where attnmt's bf16 rows are left out
   because it runs bf16 requests in float32 there).
2. Training: attnmt, JoeyNMT 2.3.0 and OpenNMT-py 3.5.1 train the same model (configs/*.yaml)
   for the same number of updates, in rounds whose order alternates (A J O, then O J A, ...)
   so that drift of the machine hits every toolkit alike. Throughput is each toolkit's own
   per-window count of non-padding target tokens (EOS included) per wall-clock second, logged
   every ``--log-every`` updates; the first window of a run (warm-up) is dropped and the rest
   are combined as total tokens / total time (the harmonic mean of the window rates, windows
   holding about the same number of tokens). Model FLOP utilisation = rate x analytic model
   FLOPs per target token / measured matmul GFLOP/s.
3. Translation of test_2016_flickr de->en, beam 5, raw text to raw text. attnmt (bf16 autocast)
   and OpenNMT-py first train a model each for ``--decode-updates`` updates (untimed), so that
   the comparison is between models of the same size and quality; attnmt translates with its
   model in fp32, bf16 and int8, OpenNMT-py with its model, and CTranslate2 float32 and int8
   with the converted OpenNMT-py model. JoeyNMT translates with its last timed-round model, and
   attnmt with a fully trained model if ``--attnmt-model`` names one. Each row has the decode
   seconds as the toolkit reports them (every translation runs ``--decode-rounds`` times, the
   order alternating between rounds, and the fastest round counts: a shared machine's noise
   only ever slows a run; JoeyNMT's minutes-long run is done once), the whole-process seconds,
   sacreBLEU and the peak resident memory.
4. Peak resident memory of every run: the summed VmRSS of the process tree, polled every 0.1 s.

Runs under attnmt's own virtual environment (it uses torch, sentencepiece and sacrebleu from
it); the peers run from their own environments made by setup_peers.sh. Standard library
otherwise. ``benchmarks/run.sh`` is the one command.

This script is the command line and the order of the phases; the work is done by the modules
beside it: measure.py (running a command: seconds, peak RSS, others' CPU load), setting.py (the
shared setting, environments, data), training.py, decoding.py and report.py (the Markdown report).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from decoding import decode_jobs, fastest_rounds
from measure import idle_other_cores, run
from report import write_results
from setting import HERE, LABEL, ROOT, TOOLKITS, Setting, machine_info, peer_venv, prepare_data, versions
from training import matmul_probe, model_flops_per_target_token, timed_rounds, train_decode_models


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The command line (this module's docstring is its description)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=str(HERE / "work"), help="work folder (venvs, data, runs); default benchmarks/work")
    ap.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA"),
                    help="folder holding multi30k/{train,val,test_2016_flickr}.{de,en}.gz (default $ATTNMT_DATA)")
    ap.add_argument("--updates", type=int, default=120, help="updates per toolkit per round")
    ap.add_argument("--rounds", type=int, default=2, help="training rounds; the order alternates between rounds")
    ap.add_argument("--log-every", type=int, default=20, help="throughput window in updates")
    ap.add_argument("--warmup", type=int, default=200, help="noam warm-up updates")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-batch", type=int, default=128, help="sentences per translation batch")
    ap.add_argument("--test-lines", type=int, default=0, help="translate only the first N test lines (0: all)")
    ap.add_argument("--toolkits", default=",".join(TOOLKITS),
                    help="comma-separated subset of attnmt,joeynmt,onmt (add attnmt-bf16 for bf16 autocast training)")
    ap.add_argument("--attnmt-model", default=str(ROOT / "runs/de-en"),
                    help="a fully trained attnmt model directory to time decoding on too (skipped if absent)")
    ap.add_argument("--decode-rounds", type=int, default=2,
                    help="translation rounds (order alternates; each row reports its fastest; JoeyNMT runs once)")
    ap.add_argument("--decode-updates", type=int, default=600,
                    help="train attnmt (bf16) and OpenNMT-py this many updates for the translation table "
                         "(0: translate with the last timed round's models)")
    ap.add_argument("--no-decode", action="store_true", help="training only")
    ap.add_argument("--no-train", action="store_true", help="no timed training rounds (machine limit and translation)")
    ap.add_argument("--nice", type=int, default=0, help="run every command under nice -n N (smoke tests)")
    ap.add_argument("--results", default=str(HERE / "work" / "suite" / "report.md"),
                    help="the Markdown report to write (default benchmarks/work/suite/report.md)")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite --results from the last run's work/suite/results.json (same options as that run)")
    ap.add_argument("--matmul-probe", action="store_true", help=argparse.SUPPRESS)
    return ap, ap.parse_args(argv)


def make_setting(args: argparse.Namespace, argv: list[str] | None) -> Setting:
    """The run's Setting from the command line; ``bf16`` from this CPU (no bf16 rows without
    bfloat16 kernels)."""
    if not args.data_dir:
        sys.exit("bench.py: error: name the directory holding multi30k/ with --data-dir or ATTNMT_DATA")
    work = Path(args.work).resolve() / "suite"
    model = Path(args.attnmt_model).resolve() if args.attnmt_model else None
    cmd = os.environ.get("BENCH_COMMAND") or "python benchmarks/bench.py " + shlex.join(argv or sys.argv[1:])
    s = Setting(work=work, data_src=Path(args.data_dir) / "multi30k", updates=args.updates, rounds=args.rounds,
                log_every=args.log_every, warmup=args.warmup, threads=args.threads, decode_batch=args.decode_batch,
                test_lines=args.test_lines, nice=args.nice,
                attnmt_model=model if model and (model / "model.safetensors").exists() else None,
                toolkits=tuple(t for t in args.toolkits.split(",") if t), decode=not args.no_decode,
                decode_updates=args.decode_updates, decode_rounds=max(1, args.decode_rounds),
                results=Path(args.results).resolve(), command=cmd,
                env={"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
                     "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1"})
    from attnmt.precision import cpu_bf16_is_fast

    s.bf16 = cpu_bf16_is_fast()
    if not s.bf16 and "attnmt-bf16" in s.toolkits:
        s.toolkits = tuple(t for t in s.toolkits if t != "attnmt-bf16")
        print("[bench] this CPU has no bfloat16 kernels (attnmt trains and translates bf16 requests in float32): "
              "no bf16 rows", flush=True)
    return s


def check_toolkits(ap: argparse.ArgumentParser, s: Setting) -> None:
    """Exit with a usage error for an unknown toolkit or a peer whose environment is missing."""
    for tk in s.toolkits:
        if tk not in LABEL:
            ap.error(f"unknown toolkit {tk!r}")
        if tk in ("joeynmt", "onmt") and not (peer_venv(s.work.parent, tk) / "bin/python").exists():
            ap.error(f"{peer_venv(s.work.parent, tk)} is missing: run benchmarks/setup_peers.sh (or benchmarks/run.sh)")


def clear_work(s: Setting) -> None:
    """Remove the last run's runs and translations (and its data if prepared for another
    ``--test-lines``)."""
    setting_file = s.work / "setting.json"
    if s.data.exists() and (not setting_file.exists()
                            or json.loads(setting_file.read_text()).get("test_lines") != s.test_lines):
        shutil.rmtree(s.data)  # prepared for another --test-lines
    if s.runs.exists():
        shutil.rmtree(s.runs)
    if (s.work / "decode").exists():
        shutil.rmtree(s.work / "decode")
    s.work.mkdir(parents=True, exist_ok=True)
    setting_file.write_text(json.dumps({"test_lines": s.test_lines}))


def measure_machine(s: Setting, res: dict) -> None:
    """Into ``res``: test size, FLOPs per target token, the matmul limit (in a fresh process
    with the runs' environment), the machine and the versions."""
    data = prepare_data(s)
    res["test_lines"] = len((s.data / "test.de").read_text(encoding="utf-8").splitlines())
    res["flops"] = model_flops_per_target_token(data["lengths"], vocab=data["vocab_size"])
    probe = run([str(ROOT / ".venv/bin/python"), str(Path(__file__).resolve()), "--matmul-probe", "--threads",
                 str(s.threads)], s.work / "matmul.log", env=s.env, nice=s.nice, capture_stdout=True)
    res["matmul"] = json.loads(probe.stdout.strip().splitlines()[-1])
    res["matmul"]["other_cores"] = probe.other_cores
    print(f"[bench] matmul GFLOP/s: fp32 {res['matmul']['fp32']:.1f}, bf16 {res['matmul']['bf16']:.1f}", flush=True)
    res["machine"] = machine_info(res["matmul"])
    res["versions"] = versions(s.work.parent)


def translations(s: Setting, train: dict[str, dict], res: dict, failures: list[str]) -> list[dict]:
    """The translation table's records: attnmt and OpenNMT-py with models trained for
    ``--decode-updates`` (or the last timed round's), the other systems as decoding.decode_jobs lists."""
    models = {tk: {**train[tk]["last"], "label": f"{s.updates} updates"} for tk in ("attnmt", "onmt")
              if tk in train}
    if s.decode_updates:
        try:
            trained = train_decode_models(s)
        except RuntimeError as e:
            failures.append(f"train translation models: {e}")
            print(f"[bench] FAILED: {e}", flush=True)
            trained = {}
        kept = ("updates", "process_s", "peak_rss", "valid_ppl", "rate", "precision")
        res["decode_models"] = {tk: {k: r[k] for k in kept if k in r} for tk, r in trained.items()}
        models.update({tk: {**r, "label": f"{s.decode_updates} updates"} for tk, r in trained.items()})
    return fastest_rounds(s, decode_jobs(s, models, train, res), failures)


def main(argv: list[str] | None = None) -> int:
    """The suite: setting, machine limit, timed training rounds, translation, results.json and
    the Markdown report. Exit status 1 if a run failed (the others still reported)."""
    ap, args = parse_args(argv)
    if args.matmul_probe:
        print(json.dumps(matmul_probe(args.threads)))
        return 0
    t_suite = time.perf_counter()
    s = make_setting(args, argv)
    if args.report_only:
        res = json.loads((s.work / "results.json").read_text(encoding="utf-8"))
        write_results(s, res)
        return 0
    check_toolkits(ap, s)
    clear_work(s)
    res: dict = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "command": s.command,
                 "test_lines": s.test_lines or None, "bf16_fast": s.bf16}
    print(f"[bench] work folder {s.work}", flush=True)
    idle_load = idle_other_cores(2.0)
    if idle_load > 0.1:
        print(f"[bench] WARNING: other processes keep {idle_load:.2f} cores busy; the figures will be low "
              "(each run's 'other CPU load' is reported)", flush=True)
    measure_machine(s, res)
    failures: list[str] = []
    res["train"] = train = timed_rounds(s, failures) if not args.no_train else {}
    res["decode"] = translations(s, train, res, failures) if s.decode else []
    res["failures"] = failures
    res["suite_minutes"] = (time.perf_counter() - t_suite) / 60
    (s.work / "results.json").write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
    write_results(s, res)
    if failures:
        print("[bench] failures:\n  " + "\n  ".join(failures), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
