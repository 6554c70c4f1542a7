"""train: attnmt and its peers in one shared setting, and the compiled training step.

``--part peers`` (JoeyNMT, OpenNMT-py and eole run from the virtual environments of
``benchmarks/setup_peers.sh``; a peer without one is left out, in one line naming why):

1. The machine limit: float32 and bfloat16 2048x2048 matmul GFLOP/s (bfloat16 512x512 on a CPU
   without bfloat16 kernels, where attnmt's bf16 rows are left out).
2. Training: every toolkit trains the same model (``configs/*.yaml``: d_model 256, 3+3 layers, 8k
   joint SentencePiece, 4,096-token batches, noam) for ``--updates`` updates in alternating rounds:
   its own target tokens/s (first window dropped), MFU (analytic FLOPs over the matmul rate), peak RSS.
3. Translation of test_2016_flickr, beam 5, raw text to raw text, by models of ``--decode-updates``
   (attnmt fp32, bf16, int8; OpenNMT-py; CTranslate2 on its model; eole: BLEU at equal updates;
   JoeyNMT once, its model of ``--updates``), fastest round.

``--part compile``: the de-en preset eager, then compiled (``train.compile``), ``--steps`` updates
each at a constant rate per ``--precisions``: last window's tokens/s, MFU, the final validation
loss, graphs compiled and compile seconds (empty inductor cache).

``--part ddp``: the preset for ``--steps`` updates under torchrun with 2 processes of 1 thread, and in
one process of 2 threads accumulating 2 batches (the same updates): validation perplexity and rate.

``--part precision``: what ``train.precision: auto`` chooses on this CPU model and whether it is right:
the preset trained ``--steps`` updates in float32 and in bfloat16 at a constant rate (last window's
tokens/s), then started with ``auto`` and an empty timing cache (``ATTNMT_PRECISION_CACHE``): the
rates its timing measured, the seconds it took and its choice (1: bf16, 0: fp32).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import harness as h
from decoding import decode_jobs, fastest_rounds
from setting import LABEL, PEERS, TOOLKITS, Setting, peer_venv, prepare_data, versions
from training import model_flops_per_target_token, timed_rounds, train_decode_models

PARTS = {"peers": ["--part", "peers"], "compile": ["--part", "compile"], "ddp": ["--part", "ddp"],
         "precision": ["--part", "precision"]}
SMOKE = {"updates": 4, "rounds": 1, "log_every": 2, "warmup": 10, "decode_updates": 0, "test_lines": 8,
         "decode_rounds": 1, "steps": 2, "toolkits": "attnmt,joeynmt,onmt",
         "config": lambda args: h.small_config(args, args.work / "smoke" / "compile")}
MODELS = ("attnmt_model",)


def add_arguments(p) -> None:
    p.add_argument("--part", choices=("peers", "compile", "ddp", "precision"), default="peers")
    p.add_argument("--updates", type=int, default=120, help="peers: updates per toolkit per round")
    p.add_argument("--rounds", type=int, default=2, help="peers: training rounds, the order alternating")
    p.add_argument("--log-every", type=int, default=20, help="peers: throughput window in updates")
    p.add_argument("--warmup", type=int, default=200, help="peers: noam warm-up updates")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decode-batch", type=int, default=128, help="peers: sentences per translation batch")
    p.add_argument("--test-lines", type=int, default=0, help="peers: translate only the first N test lines")
    p.add_argument("--toolkits", default=",".join(TOOLKITS), help="peers: subset of " + ",".join(TOOLKITS))
    p.add_argument("--attnmt-model", type=Path, help="peers: a fully trained attnmt model to time translation of too")
    p.add_argument("--decode-rounds", type=int, default=2, help="peers: translation rounds (fastest kept)")
    p.add_argument("--decode-updates", type=int, default=600, help="peers: updates of the translation models")
    p.add_argument("--no-decode", action="store_true", help="peers: training only")
    p.add_argument("--config", type=Path, default=h.ROOT / "configs" / "multi30k_de_en.yaml", help="compile, ddp, precision: preset")
    p.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "bf16"], help="compile")
    p.add_argument("--steps", type=int, default=300, help="compile, ddp, precision: updates of each run")


def setting(args) -> Setting:
    """The peers run's Setting; toolkits whose environment is missing are left out (named)."""
    from attnmt.precision import cpu_bf16_is_fast

    work = (args.work / "suite").resolve()
    toolkits = [t for t in args.toolkits.split(",") if t]
    for tk in [t for t in toolkits if t in PEERS]:
        unavailable = peer_venv(tk) / "UNAVAILABLE"  # setup_peers.sh could not install it: its reason
        if unavailable.is_file():
            print(f"[bench] {LABEL[tk]} left out: {unavailable.read_text(encoding='utf-8').strip()}", flush=True)
            toolkits.remove(tk)
        elif not (peer_venv(tk) / ".ready").exists():
            print(f"[bench] {LABEL[tk]} left out: {peer_venv(tk)} is missing "
                  "(make it with bash benchmarks/setup_peers.sh)", flush=True)
            toolkits.remove(tk)
    s = Setting(work=work, data_src=Path(args.data) / "multi30k", updates=args.updates, rounds=args.rounds,
                log_every=args.log_every, warmup=args.warmup, threads=args.threads, decode_batch=args.decode_batch,
                test_lines=args.test_lines, attnmt_model=args.attnmt_model, toolkits=tuple(toolkits),
                decode=not args.no_decode, decode_updates=args.decode_updates, decode_rounds=max(1, args.decode_rounds),
                env={"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
                     "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1"})
    s.bf16 = cpu_bf16_is_fast()
    s.toolkits = tuple(t for t in s.toolkits if s.bf16 or t != "attnmt-bf16")
    for path in (s.runs, s.work / "decode"):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    return s


def probe(threads: int) -> dict:
    """The matmul rates, in a fresh process on ``threads`` threads."""
    code = f"import sys, json; sys.path.insert(0, {str(h.HERE)!r}); from training import matmul_probe; " \
           f"print(json.dumps(matmul_probe({threads})))"
    return json.loads(h.run([sys.executable, "-c", code], env={"OMP_NUM_THREADS": str(threads)}).output.splitlines()[-1])


def peers(args) -> None:
    """Machine limit, alternating training rounds, translation; each figure recorded."""
    s = setting(args)
    data = prepare_data(s)
    flops = model_flops_per_target_token(data["lengths"], vocab=data["vocab_size"])["flops_per_tgt_token"]
    rates = probe(s.threads)
    bf16 = f"{rates['bf16']:.1f}" + ("" if rates.get("n_bf16", 2048) == 2048 else f" ({rates['n_bf16']}x{rates['n_bf16']})")
    for column, rate in (("float32", rates["fp32"]), ("bfloat16", rates["bf16"])):
        h.record(args, "Matmul limit", "matmul rate", column, round(rate, 1), "GFLOP/s", n=rates["n"],
                 n_bf16=rates["n_bf16"], threads=rates["threads"])
    failures: list[str] = []
    train = timed_rounds(s, failures)
    for tk, agg in train.items():
        precision = "bf16 autocast" if tk == "attnmt-bf16" else "float32"
        peak = rates["bf16" if tk == "attnmt-bf16" else "fp32"] * 1e9
        mfu = (agg["rate"] or 0) * flops / peak
        for column, value, unit in (("tgt tok/s", round(agg["rate"] or 0), "tok/s"), ("MFU", round(mfu, 3), "share"),
                                    ("peak RSS", round(agg["peak_rss"] / 2**30, 2), "GiB")):
            h.record(args, "Training throughput, benchmark setting", f"{LABEL[tk.replace('-bf16', '')]}, {precision}",
                     column, value, unit, round_rates=agg["round_rates"], versions=versions())
    if s.decode:
        models = {tk: {**train[tk]["last"], "label": f"{s.updates} updates"} for tk in ("attnmt", "onmt", "eole")
                  if tk in train}
        if s.decode_updates:
            models.update({tk: {**r, "label": f"{s.decode_updates} updates"} for tk, r in train_decode_models(s).items()})
        for rec in fastest_rounds(s, *decode_jobs(s, models, train), failures):
            for column, value, unit in (("decode s", round(rec["decode_s"], 2), "s"),
                                        ("process s", round(rec["process_s"], 2), "s"),
                                        ("BLEU", round(rec["bleu"], 2), "BLEU"),
                                        ("peak RSS", round(rec["peak_rss"] / 2**20), "MiB")):
                h.record(args, "Translation speed, benchmark setting", f"{rec['system']} ({rec['model']})", column,
                         value, unit)
    if failures:
        raise SystemExit("failures:\n  " + "\n  ".join(failures))


def trained(args, name: str, sets: dict, env: dict | None = None, torchrun: bool = False) -> list[dict]:
    """``--config`` trained from scratch with ``sets`` into the work folder's ``name`` (harness.trained): its log."""
    return h.trained(args, args.config, args.work / args.suite / name, *h.set_args([f"{k}={v}" for k, v in sets.items()]),
                     env=env, torchrun=torchrun, fresh=True)


def compiled(args) -> None:
    """Eager against compiled training, each precision; each run recorded."""
    from attnmt.config import load_config
    from attnmt.data.tokenizers import Tokenizer

    rates, config = probe(args.threads), load_config(args.config)
    for precision in args.precisions:
        for compile in (False,) if args.smoke else (False, True):  # compiling takes minutes
            name = f"{precision}-{'compiled' if compile else 'eager'}"
            sets = {"train.compile": str(compile).lower(), "train.dropout_curriculum": 0, "train.precision": precision,
                    **h.schedule_sets("constant"),
                    **dict(x.split("=") for x in h.capped(args.steps)),
                    "train.log_every": min(100, max(1, args.steps // 2)), "train.valid_bleu": "false"}
            cache = args.work / args.suite / f"{name}-inductor-cache"  # empty: a machine's first compile
            shutil.rmtree(cache, ignore_errors=True)
            logged = trained(args, name, sets, env={"TORCHINDUCTOR_CACHE_DIR": str(cache)})
            rate = h.last(logged, "train", "tgt_tokens_per_s")
            loss = h.last(logged, "valid", "valid_loss")
            done = h.last(logged, "done")
            tok = Tokenizer.load(args.work / args.suite / name / "spm.model")
            pair = config.data.pair.split("-")
            lengths = list(zip(*[[len(ids) + 1 for ids in tok.encode_batch(h.read_lines(h.corpus(args, "train", x)))]
                                 for x in pair]))
            m = config.model
            flops = model_flops_per_target_token(lengths, d=m.d_model, f=m.d_ff, layers_enc=m.num_encoder_layers,
                                                 layers_dec=m.num_decoder_layers, vocab=len(tok))["flops_per_tgt_token"]
            mfu = rate * flops / (rates["bf16" if done["precision"] == "bf16" else "fp32"] * 1e9)
            figure = f"{'compiled' if compile else 'eager'}, {done['precision']}"
            section = "Compiled training step (`train.compile`)"
            figures = [("tgt tok/s", round(rate), "tok/s"), ("MFU", round(mfu, 3), "share"),
                       ("valid loss", round(loss, 4), "nats")]
            if done.get("compiled_graphs") is not None:
                figures += [("compiled graphs", done["compiled_graphs"], "graphs"),
                            ("compile time", round(done["compile_seconds"]), "s")]
            for column, value, unit in figures:
                h.record(args, section, figure, column, value, unit, steps=args.steps)


def data_parallel(args) -> None:
    """torchrun x2 (1 thread each) against 1 process of 2 threads accumulating the same updates: ppl, rate."""
    sets = {**h.schedule_sets("noam"), "train.device": "cpu", "train.batch_tokens": 2048, "train.lr_factor": 1.0,
            "train.warmup_steps": 1600, **dict(x.split("=") for x in h.capped(args.steps)),
            "train.log_every": min(100, max(1, args.steps // 2))}
    for column, torchrun, extra in (("2 processes x 1 thread (torchrun, gloo)", True, {"train.num_threads": 1}),
                                    ("1 process x 2 threads, accum_steps 2", False,
                                     {"train.num_threads": 2, "train.accum_steps": 2})):
        logged = trained(args, f"ddp-{len(extra)}", {**sets, **extra}, torchrun=torchrun)
        for figure, value, unit in (("valid perplexity", round(h.last(logged, "valid", "valid_ppl"), 2), "perplexity"),
                                    ("tgt tok/s", round(h.last(logged, "train", "tgt_tokens_per_s")), "tok/s")):
            h.record(args, "Data-parallel training on CPU", figure, column, value, unit, steps=args.steps)


def precision_choice(args) -> None:
    """Training rates in fp32 and bf16, then train.precision auto's timing and choice; each recorded."""
    section, figure = "Training precision (`train.precision: auto`)", args.config.stem
    sets = {**h.schedule_sets("constant"), "train.dropout_curriculum": 0,
            **dict(x.split("=") for x in h.capped(args.steps)), "train.log_every": min(100, max(1, args.steps // 2)),
            "train.valid_bleu": "false", "train.num_threads": args.threads}
    from attnmt.precision import cpu_bf16_is_fast

    for name in ("fp32", "bf16") if cpu_bf16_is_fast() else ("fp32",):  # bf16 without its kernels: far slower
        logged = trained(args, f"precision-{name}", {**sets, "train.precision": name})
        rate = round(h.last(logged, "train", "tgt_tokens_per_s"))
        h.record(args, section, figure, f"{name} tgt tok/s", rate, "tok/s", steps=args.steps)
    cache = args.work / args.suite / "precision-cache.json"  # empty: this CPU model's first timing
    cache.unlink(missing_ok=True)
    trained(args, "precision-auto", {**sets, "train.precision": "auto", "train.max_steps": 1},
            env={"ATTNMT_PRECISION_CACHE": str(cache)})
    chosen = json.loads((args.work / args.suite / "precision-auto" / "precision.json").read_text(encoding="utf-8"))
    for name, rate in chosen["rates"].items():
        h.record(args, section, figure, f"auto's timing: {name} tok/s", round(rate), "tok/s")
    h.record(args, section, figure, "auto's timing: seconds", round(chosen["seconds"], 1), "s")
    h.record(args, section, figure, "auto chose bf16", int(chosen["precision"] == "bf16"), "1 bf16, 0 fp32")


def run(args) -> None:
    os.environ.setdefault("ATTNMT_DATA", str(args.data))
    {"peers": peers, "compile": compiled, "ddp": data_parallel, "precision": precision_choice}[args.part](args)
