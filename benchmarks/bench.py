#!/usr/bin/env python3
"""attnmt's benchmark suite: attnmt and its peers side by side, in one run, on one machine.

What it measures (see RESULTS.md, which this script rewrites):

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
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import platform
import re
import resource
import shlex
import shutil
import string
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TOOLKITS = ("attnmt", "attnmt-bf16", "joeynmt", "onmt")
MAX_OUTPUT = 100  # OpenNMT-py/CTranslate2 output cap (subwords); attnmt: 1.5 S + 10, JoeyNMT: 1.5 S
LABEL = {"attnmt": "attnmt", "attnmt-bf16": "attnmt (bf16 autocast)", "joeynmt": "JoeyNMT 2.3.0",
         "onmt": "OpenNMT-py 3.5.1"}


# ----------------------------------------------------------------------------- processes, RSS

def _children() -> dict[int, list[int]]:
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
    """Summed resident memory (VmRSS) of ``pid`` and all its descendants."""
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


@dataclass
class Proc:
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
    wall seconds and peak tree RSS."""
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
                stop.wait(0.1)

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


# ----------------------------------------------------------------------------- setting

@dataclass
class Setting:
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
    bf16: bool = True  # the CPU has bfloat16 kernels (attnmt.runtime.cpu_bf16_is_fast)

    @property
    def data(self) -> Path:
        return self.work / "data"

    @property
    def runs(self) -> Path:
        return self.work / "runs"

    def fill(self, template: str, dest: Path, updates: int | None = None, **extra) -> Path:
        text = fill_template(template, data=self.data, updates=updates or self.updates, warmup=self.warmup,
                             threads=self.threads, log_every=self.log_every, decode_batch=self.decode_batch, **extra)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")
        return dest


def fill_template(template: str, **values) -> str:
    """The text of ``configs/<template>`` with its ``$name`` placeholders filled from ``values``."""
    return string.Template((HERE / "configs" / template).read_text(encoding="utf-8")).substitute(**values)


def peer_venv(work_root: Path, toolkit: str) -> Path:
    return work_root / ("venv-joeynmt" if toolkit == "joeynmt" else "venv-onmt")


# ----------------------------------------------------------------------------- data

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
    unigram, 8000 pieces, character coverage 1.0), shared by every toolkit."""
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


# ----------------------------------------------------------------------------- FLOPs

def model_flops_per_target_token(lengths: list[tuple[int, int]], d: int = 256, f: int = 512, layers_enc: int = 3,
                                 layers_dec: int = 3, vocab: int = 8000) -> dict:
    """Training FLOPs per target token of the benchmark model (forward + backward = 3 x forward).

    Forward FLOPs of one sentence pair with S source and T target tokens (EOS included):
        2 * W_src * S + 2 * W_tgt * T + 4 * D * (L_e * S^2 + L_d * (T^2 + T * S))
    where W_src = L_e * (4 D^2 + 2 D F) + L_d * 2 D^2 are the matmul weights each source token
    meets (encoder self-attention Q/K/V/O and feed-forward; the decoder's cross-attention K/V
    projections of the memory), W_tgt = L_d * (4 D^2 + 2 D^2 + 2 D F) + D V those each target
    token meets (self-attention Q/K/V/O, cross-attention Q/O, feed-forward, the output projection
    onto the vocabulary), and the last term is attention scores QK^T and the weighted sum of the
    values (2 D FLOPs each per query-key pair, the full T x T of the decoder's self-attention
    counted, as it is computed). Embedding look-ups, biases, layer norms, softmax and the loss are
    left out (under 1%). Sums run over the training corpus; padding is not counted.
    """
    w_src = layers_enc * (4 * d * d + 2 * d * f) + layers_dec * 2 * d * d
    w_tgt = layers_dec * (6 * d * d + 2 * d * f) + d * vocab
    fwd_dense = fwd_attn = 0
    tgt_tokens = src_tokens = 0
    for s_len, t_len in lengths:
        fwd_dense += 2 * w_src * s_len + 2 * w_tgt * t_len
        fwd_attn += 4 * d * (layers_enc * s_len * s_len + layers_dec * (t_len * t_len + t_len * s_len))
        src_tokens += s_len
        tgt_tokens += t_len
    per_tok = 3 * (fwd_dense + fwd_attn) / tgt_tokens
    return {"flops_per_tgt_token": per_tok, "dense_share": fwd_dense / (fwd_dense + fwd_attn),
            "w_src": w_src, "w_tgt": w_tgt, "src_per_tgt": src_tokens / tgt_tokens,
            "mean_src_len": src_tokens / len(lengths), "mean_tgt_len": tgt_tokens / len(lengths),
            "approx_6N": 6 * (w_tgt + w_src * src_tokens / tgt_tokens)}


# ----------------------------------------------------------------------------- matmul probe

def matmul_probe(threads: int, n: int = 2048) -> dict:
    import torch

    from attnmt.runtime import cpu_bf16_is_fast

    torch.set_num_threads(threads)
    # Without bf16 kernels one 2048x2048 bf16 matmul takes about a minute: measure 512x512 there.
    n_bf16 = n if cpu_bf16_is_fast() else min(n, 512)
    out = {"threads": torch.get_num_threads(), "n": n, "n_bf16": n_bf16, "torch": torch.__version__}
    for name, dtype, n in (("fp32", torch.float32, n), ("bf16", torch.bfloat16, n_bf16)):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        c = a @ b
        for _ in range(2):
            torch.mm(a, b, out=c)
        best = 0.0
        for _trial in range(3):
            reps, t0 = 0, time.perf_counter()
            while True:
                torch.mm(a, b, out=c)
                reps += 1
                el = time.perf_counter() - t0
                if el >= 1.0 and reps >= 2:
                    break
            best = max(best, 2 * n ** 3 * reps / el / 1e9)
        out[name] = best
    return out


# ----------------------------------------------------------------------------- training

def combine_windows(windows: list[tuple[int, float]], log_every: int) -> float | None:
    """Harmonic mean of the per-window rates after the first window (total tokens / total time)."""
    rates = [r for step, r in windows if step > log_every and r > 0]
    if not rates:
        rates = [r for _, r in windows if r > 0]
    return len(rates) / sum(1 / r for r in rates) if rates else None


def train_attnmt(s: Setting, out: Path, precision: str = "fp32", updates: int | None = None) -> dict:
    cfg = s.fill("attnmt.yaml", out.parent / f"{out.name}.yaml", updates=updates, precision=precision)
    if out.exists():
        shutil.rmtree(out)
    p = run([str(ROOT / ".venv/bin/attnmt"), "train", str(cfg), "--output", str(out)], out.parent / f"{out.name}.log",
            env=s.env, nice=s.nice)
    records = [json.loads(ln) for ln in (out / "train_log.jsonl").read_text(encoding="utf-8").splitlines()]
    windows = [(r["step"], r["tgt_tokens_per_s"]) for r in records if r["kind"] == "train"]
    done = next(r for r in records if r["kind"] == "done")
    valid = [r for r in records if r["kind"] == "valid"]
    return {"windows": windows, "rate": combine_windows(windows, s.log_every), "process_s": p.seconds,
            "peak_rss": p.peak_rss, "other_cores": p.other_cores, "updates": done["steps"], "model": str(out),
            "own_rate_excl_batching": done["tgt_tokens_per_second"],
            "valid_ppl": valid[-1]["valid_ppl"] if valid else None, "precision": done.get("precision", precision)}


def train_joeynmt(s: Setting, out: Path) -> dict:
    cfg = s.fill("joeynmt.yaml", out.parent / f"{out.name}.yaml", model_dir=out)
    py = peer_venv(s.work.parent, "joeynmt") / "bin/python"
    p = run([str(py), "-m", "joeynmt", "train", str(cfg), "--skip-test"], out.parent / f"{out.name}.log",
            env=s.env, nice=s.nice)
    text = (out / "train.log").read_text(encoding="utf-8", errors="replace")
    windows = [(int(m.group(1)), float(m.group(2)))
               for m in re.finditer(r"Step:\s+(\d+),.*?Tokens per Sec:\s+([\d.]+)", text)]
    return {"windows": windows, "rate": combine_windows(windows, s.log_every), "process_s": p.seconds,
            "peak_rss": p.peak_rss, "other_cores": p.other_cores, "updates": max((w[0] for w in windows), default=0), "model": str(out),
            "config": str(cfg)}


def train_onmt(s: Setting, out: Path, updates: int | None = None) -> dict:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cfg = s.fill("onmt.yaml", out.parent / f"{out.name}.yaml", updates=updates, model_dir=out)
    bin_dir = peer_venv(s.work.parent, "onmt") / "bin"
    p = run([str(bin_dir / "onmt_train"), "-config", str(cfg)], out.parent / f"{out.name}.log", env=s.env,
            nice=s.nice)
    text = p.log.read_text(encoding="utf-8", errors="replace")
    windows = [(int(m.group(1)), float(m.group(3)))
               for m in re.finditer(r"Step\s+(\d+)/\s*\d+;.*?([\d.]+)/\s*([\d.]+) tok/s", text)]
    ckpts = sorted(out.glob("model_step_*.pt"), key=lambda q: int(q.stem.rsplit("_", 1)[1]))
    if not ckpts:
        raise RuntimeError(f"OpenNMT-py wrote no checkpoint in {out}")
    return {"windows": windows, "rate": combine_windows(windows, s.log_every), "process_s": p.seconds,
            "peak_rss": p.peak_rss, "other_cores": p.other_cores, "updates": max((w[0] for w in windows), default=0), "model": str(ckpts[-1])}


def train_one(s: Setting, toolkit: str, rnd: int) -> dict:
    out = s.runs / f"{toolkit}-r{rnd + 1}"
    if toolkit == "attnmt":
        return train_attnmt(s, out)
    if toolkit == "attnmt-bf16":
        return train_attnmt(s, out, precision="bf16")
    if toolkit == "joeynmt":
        return train_joeynmt(s, out)
    return train_onmt(s, out)


# ----------------------------------------------------------------------------- translation

def bleu(hyp_path: Path, ref_path: Path) -> dict:
    import sacrebleu

    hyps = hyp_path.read_text(encoding="utf-8").split("\n")[:-1]
    refs = ref_path.read_text(encoding="utf-8").split("\n")[:-1]
    if len(hyps) != len(refs):
        raise RuntimeError(f"{hyp_path}: {len(hyps)} lines for {len(refs)} references")
    b = sacrebleu.metrics.BLEU()
    score = b.corpus_score(hyps, [refs])
    return {"bleu": round(score.score, 2), "bleu_signature": str(b.get_signature())}


def _decode_record(name: str, model: str, p: Proc, decode_s: float, hyp: Path, s: Setting) -> dict:
    rec = {"system": name, "model": model, "decode_s": decode_s, "process_s": p.seconds, "peak_rss": p.peak_rss, "other_cores": p.other_cores,
           "hyp": str(hyp)}
    rec.update(bleu(hyp, s.data / "test.en"))
    print(f"[bench]   {name}: decode {decode_s:.2f} s, process {p.seconds:.1f} s, BLEU {rec['bleu']}", flush=True)
    return rec


def train_decode_models(s: Setting) -> dict:
    """The models the translation table compares: attnmt (bf16 autocast, its fast training mode,
    where the CPU has bf16 kernels; else float32) and OpenNMT-py (float32), each trained for
    ``--decode-updates`` updates in the shared setting."""
    out = {}
    print(f"[bench] training the translation models: {s.decode_updates} updates each (not timed)", flush=True)
    out["attnmt"] = train_attnmt(s, s.runs / "attnmt-decode-model", precision="bf16" if s.bf16 else "fp32",
                                 updates=s.decode_updates)
    if "onmt" in s.toolkits:
        out["onmt"] = train_onmt(s, s.runs / "onmt-decode-model", updates=s.decode_updates)
    return out


def decode_attnmt(s: Setting, model: Path, precision: str, label: str, model_label: str) -> dict:
    out = s.work / "decode" / f"{label}-{precision}"
    hyp = out.with_suffix(".hyp")
    p = run([str(ROOT / ".venv/bin/attnmt"), "translate", "--model", str(model), "--input", str(s.data / "test.de"),
             "--output", str(hyp), "--beam-size", "5", "--batch-size", str(s.decode_batch), "--threads",
             str(s.threads), "--precision", precision], out.with_suffix(".log"), env=s.env, nice=s.nice)
    m = re.search(r"translated \d+ lines in ([\d.]+) s", p.log.read_text(encoding="utf-8"))
    return _decode_record(f"attnmt {precision}", model_label, p, float(m.group(1)) if m else float("nan"), hyp, s)


def decode_joeynmt(s: Setting, train_rec: dict) -> dict:
    out = s.work / "decode" / "joeynmt"
    hyp = out.with_suffix(".hyp")
    py = peer_venv(s.work.parent, "joeynmt") / "bin/python"
    # JoeyNMT 2.3.0's translate fails writing to -o (AttributeError on args.n_best): stdout instead
    p = run([str(py), "-m", "joeynmt", "translate", train_rec["config"]], out.with_suffix(".log"),
            env=s.env, stdin=s.data / "test.de", nice=s.nice, stdout_file=hyp)
    m = re.search(r"Generation took ([\d.]+)\[sec\]", p.log.read_text(encoding="utf-8", errors="replace"))
    return _decode_record("JoeyNMT", f"{s.updates} updates", p, float(m.group(1)) if m else float("nan"), hyp, s)


def decode_onmt(s: Setting, train_rec: dict) -> dict:
    out = s.work / "decode" / "onmt"
    hyp = out.with_suffix(".hyp")
    bin_dir = peer_venv(s.work.parent, "onmt") / "bin"
    p = run([str(bin_dir / "onmt_translate"), "-model", train_rec["model"], "-src", str(s.data / "test.de"),
             "-output", str(hyp), "-beam_size", "5", "-batch_size", str(s.decode_batch), "-batch_type", "sents",
             "-transforms", "sentencepiece", "-src_subword_model", str(s.data / "spm.model"),
             "-tgt_subword_model", str(s.data / "spm.model"), "-length_penalty", "wu", "-alpha", "0.6",
             "-max_length", str(MAX_OUTPUT), "-report_time", "-gpu", "-1"], out.with_suffix(".log"), env=s.env, nice=s.nice)
    text = p.log.read_text(encoding="utf-8", errors="replace")
    n = len((s.data / "test.de").read_text(encoding="utf-8").splitlines())
    m = re.search(r"Average translation time \(ms\): ([\d.]+)", text)
    if m:
        decode_s = float(m.group(1)) * n / 1000
    else:
        m = re.search(r"Total translation time \(s\): ([\d.]+)", text)
        decode_s = float(m.group(1)) if m else float("nan")
    return _decode_record("OpenNMT-py", train_rec["label"], p, decode_s, hyp, s)


def decode_ct2(s: Setting, train_rec: dict) -> tuple[list[dict], float]:
    bin_dir = peer_venv(s.work.parent, "onmt") / "bin"
    ct2_dir = s.work / "decode" / "ct2-model"
    t0 = time.perf_counter()
    run([str(bin_dir / "ct2-opennmt-py-converter"), "--model_path", train_rec["model"], "--output_dir", str(ct2_dir),
         "--unsafe_deserialization", "--force"], s.work / "decode" / "ct2-convert.log", env=s.env, nice=s.nice)
    convert_s = time.perf_counter() - t0
    records = []
    for ctype in ("float32", "int8"):
        out = s.work / "decode" / f"ct2-{ctype}"
        hyp = out.with_suffix(".hyp")
        p = run([str(bin_dir / "python"), str(HERE / "ct2_translate.py"), "--model", str(ct2_dir), "--spm",
                 str(s.data / "spm.model"), "--input", str(s.data / "test.de"), "--output", str(hyp),
                 "--compute-type", ctype, "--beam-size", "5", "--batch-size", str(s.decode_batch),
                 "--threads", str(s.threads), "--max-length", str(MAX_OUTPUT)], out.with_suffix(".log"), env=s.env, nice=s.nice, capture_stdout=True)
        info = json.loads(p.stdout.strip().splitlines()[-1])
        records.append(_decode_record(f"CTranslate2 {ctype}", f"OpenNMT-py, {train_rec['label']}", p,
                                      info["decode_seconds"], hyp, s))
    return records, convert_s


# ----------------------------------------------------------------------------- report

def machine_info(probe: dict) -> dict:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        mem = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines()
                       if ln.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration):
        pass
    flags = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if re.search(rf"\b{f}\b", text)]
        flags = ", ".join(isa)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(mem / 2**30, 1), "isa": flags,
            "kernel": platform.release(), "python": platform.python_version(), "torch": probe.get("torch")}


def versions(work_root: Path) -> dict:
    out = {}
    for key, venv, pkgs in (("joeynmt", "venv-joeynmt", ["joeynmt", "torch"]),
                            ("onmt", "venv-onmt", ["OpenNMT-py", "ctranslate2", "torch"])):
        py = work_root / venv / "bin/python"
        if py.exists():
            code = "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in %r}))" % pkgs
            r = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
            out[key] = json.loads(r.stdout) if r.returncode == 0 else {}
    return out


def gib(x: int) -> str:
    return f"{x / 2**30:.2f}"


def fmt(x: float | None, nd: int = 0) -> str:
    return "–" if x is None else f"{x:,.{nd}f}"


def write_results(s: Setting, res: dict) -> None:
    m, probe, fl = res["machine"], res["matmul"], res["flops"]
    lines = [
        "# Benchmarks: attnmt and its peers",
        "",
        "Rewritten by the benchmark suite; do not edit by hand. Method and caveats: the docstring of",
        "`benchmarks/bench.py` and the notes at the end.",
        "",
        f"- **Date:** {res['date']}",
        f"- **Machine:** {m['cpu']}, {m['cores']} cores ({m['isa'] or 'no AVX2 flag'}), {m['mem_gib']} GiB RAM, "
        f"Linux {m['kernel']}, Python {m['python']}, torch {m['torch']} (CPU), no GPU; {s.threads} threads for every run",
        f"- **Command:** `{res['command']}`",
        f"- **Suite wall time:** {res['suite_minutes']:.1f} min",
    ]
    loads = [probe.get("other_cores", 0.0)] + [t.get("other_cores", 0.0) for t in res.get("train", {}).values()] \
        + [d.get("other_cores", 0.0) for d in res.get("decode", [])]
    if max(loads) > 0.05:
        lines += [
            "",
            f"> **Warning: this run shared the machine.** Other processes kept up to {max(loads):.2f} of the "
            f"{m['cores']} cores busy during it (column 'other CPU load'), so its absolute figures are low and "
            "its ratios are uncertain. Rerun the command on an idle machine.",
        ]
    lines += [
        "- **Versions:** " + "; ".join(f"{k}: " + ", ".join(f"{p} {v}" for p, v in d.items())
                                      for k, d in res["versions"].items()),
        "",
        "## Machine limit",
        "",
        f"2048x2048 matmul on {probe['threads']} threads (best of 3 one-second runs): "
        f"**{probe['fp32']:.1f} GFLOP/s float32**, **{probe['bf16']:.1f} GFLOP/s bfloat16**"
        + (f" ({probe['n_bf16']}x{probe['n_bf16']})" if probe.get("n_bf16", probe["n"]) != probe["n"] else "") + " "
        f"(other processes meanwhile: {probe.get('other_cores', 0):.2f} cores).",
        "",
    ]
    if res.get("bf16_fast") is False:
        lines += ["This CPU has no oneDNN bfloat16 kernels, so attnmt runs bf16 requests in float32 here "
                  "(`attnmt.runtime.effective_precision`) and the tables have no bf16 rows.", ""]
    lines += [
        f"Model FLOPs per target token (training, analytic, formula below): **{fl['flops_per_tgt_token'] / 1e6:.1f} "
        f"MFLOP** ({100 * fl['dense_share']:.1f}% weight matmuls, the rest attention scores and values; "
        f"mean lengths {fl['mean_src_len']:.1f} source / {fl['mean_tgt_len']:.1f} target tokens with EOS).",
        "",
    ]
    if res.get("train"):
        att = res["train"].get("attnmt", {}).get("rate")
        att16 = res["train"].get("attnmt-bf16", {}).get("rate")
        rounds_hdr = " | ".join(f"round {i + 1}" for i in range(s.rounds))
        lines += [
            f"## Training: {s.updates} updates per round, {s.rounds} rounds (order alternates), "
            "target tokens per second",
            "",
            f"| toolkit | {rounds_hdr} | tgt tok/s | attnmt fp32 / this | attnmt bf16 / this | MFU | valid ppl | "
            "peak RSS GiB | process s (last round) | other CPU load |",
            "| --- | " + " | ".join("---:" for _ in range(s.rounds)) + " | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
            "| ---: |",
        ]
        for tk, t in res["train"].items():
            peak = probe["bf16"] if tk == "attnmt-bf16" else probe["fp32"]
            mfu = t["rate"] * fl["flops_per_tgt_token"] / (peak * 1e9) if t["rate"] else None
            ratios = " | ".join(f"{a / t['rate']:.2f}" if a and t["rate"] else "–" for a in (att, att16))
            ppl = t["last"].get("valid_ppl")
            per_round = " | ".join(fmt(r) for r in t["round_rates"])
            lines.append(f"| {LABEL.get(tk, tk)} | {per_round} | **{fmt(t['rate'])}** | {ratios} | "
                         f"{fmt(100 * mfu, 1) + '%' if mfu else '–'} | {fmt(ppl, 2) if ppl else '–'} | "
                         f"{gib(t['peak_rss'])} | {t['process_s']:.0f} | {t.get('other_cores', 0.0):.2f} |")
        p32 = res["train"].get("attnmt", {}).get("last", {}).get("valid_ppl")
        p16 = res["train"].get("attnmt-bf16", {}).get("last", {}).get("valid_ppl")
        lines += [""]
        if p32 and p16:
            lines += [f"Validation perplexity (val split, 1014 sentences) after the last round's {s.updates} updates: "
                      f"bf16 autocast {p16:.2f}, float32 {p32:.2f}, a difference of {100 * (p16 / p32 - 1):+.1f}%.",
                      ""]
    if res.get("decode"):
        lines += [
            f"## Translation: test_2016_flickr de->en ({res['test_lines']} sentences), beam 5, raw text to raw text, "
            f"batches of {s.decode_batch} sentences; decode s: the fastest of {s.decode_rounds} rounds "
            "(order alternating; every round in brackets)",
            "",
            "| system | model | decode s | / CTranslate2 float32 | process s | BLEU | peak RSS GiB | other CPU load |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        ct2 = next((d["decode_s"] for d in res["decode"] if d["system"] == "CTranslate2 float32"), None)
        for d in res["decode"]:
            rel = f"{d['decode_s'] / ct2:.2f}" if ct2 else "–"
            each = d.get("decode_rounds", [d["decode_s"]])
            each_s = f" ({', '.join(f'{x:.2f}' for x in each)})" if len(each) > 1 else ""
            lines.append(f"| {d['system']} | {d['model']} | {d['decode_s']:.2f}{each_s} | {rel} | {d['process_s']:.1f} | "
                         f"{d['bleu']:.2f} | {gib(d['peak_rss'])} | {d.get('other_cores', 0.0):.2f} |")
        for tk, r in res.get("decode_models", {}).items():
            lines += ["",
                      f"Translation model of {LABEL.get(tk, tk)}: {r['updates']} updates"
                      + (" in bf16 autocast" if r.get("precision") == "bf16" else " in float32")
                      + f", trained by the suite in {r['process_s'] / 60:.1f} min (peak RSS {gib(r['peak_rss'])} GiB)"
                      + (f", validation perplexity {r['valid_ppl']:.2f}" if r.get("valid_ppl") else "") + "."]
        if res.get("ct2_convert_s") is not None:
            lines += ["", f"OpenNMT-py -> CTranslate2 conversion: {res['ct2_convert_s']:.1f} s (not in the table)."]
        sig = res["decode"][0]["bleu_signature"]
        lines += ["", f"BLEU: sacreBLEU `{sig}` on the detokenized output against the raw references.", ""]
    if res.get("failures"):
        lines += ["## Failures", ""] + [f"- {f.splitlines()[0]}" for f in res["failures"]] + [""]
    lines += [
        "## Notes",
        "",
        "- **Same setting for every toolkit** (`benchmarks/configs/`): Multi30k de->en train split, one joint "
        "SentencePiece unigram model of 8000 pieces (trained once with attnmt's settings and given to JoeyNMT and "
        "OpenNMT-py; attnmt trains the same one itself), d_model 256, 3+3 layers, 8 heads, d_ff 512, pre-norm, "
        "dropout 0.1 (attention 0.1), sinusoidal positions, source/target embeddings and output projection tied, "
        "batches of 4096 tokens (sentences x longest side), Adam (0.9, 0.98) with the noam schedule "
        f"(factor 1, {s.warmup} warm-up updates), label smoothing 0.1, gradient norm clipped at 1, float32, "
        f"sequences up to 100 subwords, OMP/MKL threads {s.threads}; no validation during the timed updates.",
        "- **Throughput** is each toolkit's own windowed count of non-padding target tokens (EOS included) per "
        f"wall-clock second, logged every {s.log_every} updates; the first window of every run is dropped "
        "(warm-up), the others are combined as total tokens / total time, then averaged over rounds. "
        "JoeyNMT's batches are not length-bucketed (its token sampler draws random sentences), so more of its "
        "4096-token budget is padding: that is part of what is measured. 'process s' includes start-up "
        "(attnmt trains its SentencePiece model in-process; the peers load the prepared one).",
        "- **MFU** = tgt tok/s x model FLOPs per target token / measured float32 matmul GFLOP/s (bfloat16 for a "
        "bf16 row). Model FLOPs per target token = 3 x forward (backward = 2 x forward), summed over the "
        "training corpus and divided by its target tokens: forward of a pair with S source and T target tokens "
        "= 2 W_src S + 2 W_tgt T + 4 D (L_e S^2 + L_d (T^2 + T S)), with "
        f"W_src = L_e (4D^2 + 2DF) + L_d 2D^2 = {fl['w_src']:,} and W_tgt = L_d (6D^2 + 2DF) + DV = {fl['w_tgt']:,} "
        "(D 256, F 512, L_e = L_d = 3, V 8000); the full T x T decoder self-attention is counted; embeddings, "
        f"biases, norms, softmax and loss are not. For comparison, the '6N' rule gives {fl['approx_6N'] / 1e6:.1f} "
        "MFLOP per target token.",
        "- **Decode seconds** are as each toolkit times its own translation loop (tokenization and "
        "detokenization included; model loading excluded): attnmt's 'translated N lines in X s', JoeyNMT's "
        "'Generation took', OpenNMT-py's average translation time x sentences (-report_time), and for "
        "CTranslate2 the time around `translate_batch` plus SentencePiece in `benchmarks/ct2_translate.py`. "
        "Process seconds are the whole command, Python start-up and model loading included. Length penalty "
        "alpha 0.6 (GNMT form for attnmt, JoeyNMT and OpenNMT-py; CTranslate2's own length normalisation with "
        "exponent 0.6). Output caps: attnmt 1.5 S + 10 subwords, JoeyNMT 1.5 x the batch's longest source, "
        f"OpenNMT-py and CTranslate2 {MAX_OUTPUT}. attnmt and OpenNMT-py translate with models trained for the "
        "same number of updates in the shared setting (`--decode-updates`, so CTranslate2 runs a model of the "
        "same size and quality as attnmt's); JoeyNMT translates with its last timed-round model (training it "
        "further would take the suite ~40 min more), and a model of a few hundred updates emits long outputs "
        "up to the caps, so that row decodes more tokens.",
        "- **Peak RSS** is the summed VmRSS of the process tree, polled every 0.1 s.",
        "- **Other CPU load** is the mean number of cores that processes outside the benchmark kept busy during "
        "that run (machine busy time from /proc/stat minus the benchmark's own CPU time): anything above ~0.05 "
        f"means the run shared the {m['cores']} cores and its figures are low.",
        "",
    ]
    s.results.write_text("\n".join(lines), encoding="utf-8")
    print(f"[bench] wrote {s.results}", flush=True)


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=str(HERE / "work"), help="work folder (venvs, data, runs); default benchmarks/work")
    ap.add_argument("--data-dir", default=os.environ.get("ATTNMT_DATA", "/work/shared/data"),
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
    ap.add_argument("--results", default=str(HERE / "RESULTS.md"), help="the Markdown file to rewrite")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite --results from the last run's work/suite/results.json (same options as that run)")
    ap.add_argument("--matmul-probe", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.matmul_probe:
        print(json.dumps(matmul_probe(args.threads)))
        return 0

    t_suite = time.perf_counter()
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
    from attnmt.runtime import cpu_bf16_is_fast

    s.bf16 = cpu_bf16_is_fast()
    if not s.bf16 and "attnmt-bf16" in s.toolkits:
        s.toolkits = tuple(t for t in s.toolkits if t != "attnmt-bf16")
        print("[bench] this CPU has no bfloat16 kernels (attnmt trains and translates bf16 requests in float32): "
              "no bf16 rows", flush=True)
    if args.report_only:
        res = json.loads((s.work / "results.json").read_text(encoding="utf-8"))
        write_results(s, res)
        return 0
    for tk in s.toolkits:
        if tk not in LABEL:
            ap.error(f"unknown toolkit {tk!r}")
        if tk in ("joeynmt", "onmt") and not (peer_venv(s.work.parent, tk) / "bin/python").exists():
            ap.error(f"{peer_venv(s.work.parent, tk)} is missing: run benchmarks/setup_peers.sh (or benchmarks/run.sh)")
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

    res: dict = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "command": cmd,
                 "test_lines": s.test_lines or None, "bf16_fast": s.bf16}
    print(f"[bench] work folder {s.work}", flush=True)
    busy0, own0 = busy_cpu_seconds(), own_cpu_seconds()
    time.sleep(2.0)
    idle_load = max(0.0, busy_cpu_seconds() - busy0 - (own_cpu_seconds() - own0)) / 2.0
    if idle_load > 0.1:
        print(f"[bench] WARNING: other processes keep {idle_load:.2f} cores busy; the figures will be low "
              "(each run's 'other CPU load' is reported)", flush=True)
    data = prepare_data(s)
    res["test_lines"] = len((s.data / "test.de").read_text(encoding="utf-8").splitlines())
    res["flops"] = model_flops_per_target_token(data["lengths"], vocab=data["vocab_size"])
    probe = run([str(ROOT / ".venv/bin/python"), str(Path(__file__).resolve()), "--matmul-probe", "--threads",
                 str(s.threads)], s.work / "matmul.log", env=s.env, nice=s.nice, capture_stdout=True)
    res["matmul"] = json.loads(probe.stdout.strip().splitlines()[-1])
    res["matmul"]["other_cores"] = probe.other_cores
    print(f"[bench] matmul GFLOP/s: fp32 {res['matmul']['fp32']:.1f}, bf16 {res['matmul']['bf16']:.1f}", flush=True)
    res["machine"] = machine_info(res["matmul"])
    res["versions"] = {"attnmt": {"attnmt": _attnmt_version()}, **versions(s.work.parent)}

    train: dict[str, dict] = {}
    failures: list[str] = []
    if not args.no_train:
        for rnd in range(s.rounds):
            order = s.toolkits if rnd % 2 == 0 else tuple(reversed(s.toolkits))
            for tk in order:
                print(f"[bench] round {rnd + 1}/{s.rounds}: training {tk} for {s.updates} updates", flush=True)
                try:
                    rec = train_one(s, tk, rnd)
                except RuntimeError as e:
                    failures.append(f"train {tk} round {rnd + 1}: {e}")
                    print(f"[bench] FAILED: {e}", flush=True)
                    continue
                print(f"[bench]   {tk}: {fmt(rec['rate'])} tgt tok/s", flush=True)
                agg = train.setdefault(tk, {"rounds": []})
                agg["rounds"].append(rec)
        for tk, agg in train.items():
            rates = [r["rate"] for r in agg["rounds"] if r["rate"]]
            agg["round_rates"] = [r["rate"] for r in agg["rounds"]] + [None] * (s.rounds - len(agg["rounds"]))
            agg["rate"] = sum(rates) / len(rates) if rates else None
            agg["peak_rss"] = max(r["peak_rss"] for r in agg["rounds"])
            agg["process_s"] = agg["rounds"][-1]["process_s"]
            agg["other_cores"] = max(r["other_cores"] for r in agg["rounds"])
            agg["last"] = agg["rounds"][-1]
    res["train"] = train

    decode: list[dict] = []
    if s.decode:
        jobs = []
        models = {tk: {**train[tk]["last"], "label": f"{s.updates} updates"} for tk in ("attnmt", "onmt")
                  if tk in train}
        if s.decode_updates:
            try:
                trained = train_decode_models(s)
            except RuntimeError as e:
                failures.append(f"train translation models: {e}")
                print(f"[bench] FAILED: {e}", flush=True)
                trained = {}
            res["decode_models"] = {tk: {k: r[k] for k in ("updates", "process_s", "peak_rss", "valid_ppl", "rate",
                                                                          "precision")
                                         if k in r} for tk, r in trained.items()}
            models.update({tk: {**r, "label": f"{s.decode_updates} updates"} for tk, r in trained.items()})
        # (job, repeated): every job runs once per decode round, in an order that alternates
        # between rounds; JoeyNMT's (minutes long) only in the first round.
        if "attnmt" in models:
            for prec in ("fp32", "bf16", "int8") if s.bf16 else ("fp32", "int8"):
                jobs.append((lambda prec=prec: decode_attnmt(s, Path(models["attnmt"]["model"]), prec,
                                                             "attnmt-bench", models["attnmt"]["label"]), True))
        if "onmt" in models:
            jobs.append((lambda: decode_onmt(s, models["onmt"]), True))
            jobs.append((lambda: _ct2(s, models["onmt"], res), True))
        if "joeynmt" in train:
            jobs.append((lambda: decode_joeynmt(s, train["joeynmt"]["last"]), False))
        if s.attnmt_model is not None:
            for prec in ("fp32", "bf16") if s.bf16 else ("fp32",):
                jobs.append((lambda prec=prec: decode_attnmt(s, s.attnmt_model, prec, "attnmt-trained",
                                                             f"trained ({_rel(s.attnmt_model)})"), True))
        by_row: dict[tuple[str, str], dict] = {}
        for rnd in range(s.decode_rounds):
            order = jobs if rnd % 2 == 0 else jobs[::-1]
            for job, repeated in order:
                if rnd > 0 and not repeated:
                    continue
                try:
                    out = job()
                except (RuntimeError, json.JSONDecodeError, IndexError) as e:
                    failures.append(f"decode round {rnd + 1}: {e}")
                    print(f"[bench] FAILED: {e}", flush=True)
                    continue
                for rec in out if isinstance(out, list) else [out]:
                    key = (rec["system"], rec["model"])
                    prev = by_row.get(key)
                    rounds = (prev["decode_rounds"] if prev else []) + [rec["decode_s"]]
                    # the fastest round is the row's figure (noise on a shared machine only slows)
                    if prev is None or rec["decode_s"] < prev["decode_s"]:
                        by_row[key] = rec
                    by_row[key]["decode_rounds"] = rounds
        decode = list(by_row.values())
    res["decode"] = decode
    res["failures"] = failures
    res["suite_minutes"] = (time.perf_counter() - t_suite) / 60
    (s.work / "results.json").write_text(json.dumps(res, indent=1, default=str), encoding="utf-8")
    write_results(s, res)
    if failures:
        print("[bench] failures:\n  " + "\n  ".join(failures), flush=True)
        return 1
    return 0


def _ct2(s: Setting, onmt_rec: dict, res: dict) -> list[dict]:
    records, convert_s = decode_ct2(s, onmt_rec)
    res["ct2_convert_s"] = convert_s
    return records


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def _attnmt_version() -> str:
    try:
        import importlib.metadata as md

        return md.version("attnmt")
    except Exception:  # noqa: BLE001 - informational only
        return "?"


if __name__ == "__main__":
    sys.exit(main())
