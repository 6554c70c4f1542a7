"""Translation runs and their scores: attnmt, JoeyNMT, OpenNMT-py, eole and CTranslate2 on test_2016.

Every system translates raw text to raw text with beam 5; each row of the translation table
has the decode seconds as the toolkit reports them, the whole-process seconds, sacreBLEU and
the peak RSS. :func:`fastest_rounds` repeats the translations, the order alternating, and keeps
each row's fastest round (a shared machine's noise only ever slows a run).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness import HERE, ROOT, Proc, alternate, bleu, decode_seconds, run, translate_cmd
from setting import MAX_OUTPUT, Setting, peer_venv


def _decode_record(name: str, model: str, p: Proc, decode_s: float, hyp: Path, s: Setting) -> dict:
    rec = {"system": name, "model": model, "decode_s": decode_s, "process_s": p.seconds, "peak_rss": p.peak_rss,
           "hyp": str(hyp), "bleu": bleu(hyp, s.data / "test.en")["bleu"]}
    print(f"[bench]   {name}: decode {decode_s:.2f} s, process {p.seconds:.1f} s, BLEU {rec['bleu']}", flush=True)
    return rec


def decode_attnmt(s: Setting, model: Path, precision: str, label: str, model_label: str) -> dict:
    """``attnmt translate`` of the test set at ``precision`` (fp32, bf16, int8)."""
    out = s.work / "decode" / f"{label}-{precision}"
    hyp = out.with_suffix(".hyp")
    p = run(translate_cmd(model, s.data / "test.de", hyp, batch=s.decode_batch, threads=s.threads, precision=precision),
            env=s.env, log=out.with_suffix(".log"), check="raise")
    return _decode_record(f"attnmt {precision}", model_label, p, decode_seconds(p.output), hyp, s)


def decode_joeynmt(s: Setting, train_rec: dict) -> dict:
    """JoeyNMT's translation of the test set with the model of ``train_rec``."""
    out = s.work / "decode" / "joeynmt"
    hyp = out.with_suffix(".hyp")
    # JoeyNMT 2.3.0's translate fails writing to -o (AttributeError on args.n_best): stdout instead
    p = run([str(peer_venv("joeynmt") / "bin/python"), "-m", "joeynmt", "translate", train_rec["config"]],
            env=s.env, log=out.with_suffix(".log"), check="raise", stdin=s.data / "test.de", stdout=hyp)
    m = re.search(r"Generation took ([\d.]+)\[sec\]", p.output)
    return _decode_record("JoeyNMT", f"{s.updates} updates", p, float(m.group(1)) if m else float("nan"), hyp, s)


def decode_onmt(s: Setting, train_rec: dict) -> dict:
    """OpenNMT-py's translation of the test set with the checkpoint of ``train_rec``."""
    out = s.work / "decode" / "onmt"
    hyp = out.with_suffix(".hyp")
    p = run([str(peer_venv("onmt") / "bin" / "onmt_translate"), "-model", train_rec["model"], "-src", str(s.data / "test.de"),
             "-output", str(hyp), "-beam_size", "5", "-batch_size", str(s.decode_batch), "-batch_type", "sents",
             "-transforms", "sentencepiece", "-src_subword_model", str(s.data / "spm.model"),
             "-tgt_subword_model", str(s.data / "spm.model"), "-length_penalty", "wu", "-alpha", "0.6",
             "-max_length", str(MAX_OUTPUT), "-report_time", "-gpu", "-1"], env=s.env, log=out.with_suffix(".log"),
            check="raise")
    n = len((s.data / "test.de").read_text(encoding="utf-8").splitlines())
    average, total = (re.search(pattern, p.output) for pattern in (r"Average translation time \(ms\): ([\d.]+)",
                                                                   r"Total translation time \(s\): ([\d.]+)"))
    decode_s = float(average.group(1)) * n / 1000 if average else float(total.group(1)) if total else float("nan")
    return _decode_record("OpenNMT-py", train_rec["label"], p, decode_s, hyp, s)


def decode_eole(s: Setting, train_rec: dict) -> dict:
    """eole's translation of the test set with the model of ``train_rec`` (its SentencePiece transform
    kept in the model's config; decode seconds: step 0 and the rest, as ``-report_time`` logs them)."""
    out = s.work / "decode" / "eole"
    hyp = out.with_suffix(".hyp")
    p = run([str(peer_venv("eole") / "bin" / "eole"), "predict", "-model_path", train_rec["model"],
             "-src", str(s.data / "test.de"), "-output", str(hyp), "-beam_size", "5",
             "-batch_size", str(s.decode_batch), "-batch_type", "sents", "-length_penalty", "wu", "-alpha", "0.6",
             "-max_length", str(MAX_OUTPUT), "-report_time"], env=s.env, log=out.with_suffix(".log"), check="raise")
    parts = [re.search(pattern, p.output) for pattern in (r"Step 0 time \(s\): ([\d.]+)",
                                                          r"Subsequent prediction time including all \(s\): ([\d.]+)")]
    decode_s = sum(float(m.group(1)) for m in parts if m) if parts[1] else float("nan")
    return _decode_record("eole", train_rec["label"], p, decode_s, hyp, s)


def decode_ct2(s: Setting, train_rec: dict, ctype: str) -> dict:
    """The OpenNMT-py checkpoint of ``train_rec`` converted to CTranslate2 (once) translating the test
    set with ``ctype`` weights (ct2_translate.py)."""
    bin_dir = peer_venv("onmt") / "bin"
    ct2_dir = s.work / "decode" / "ct2-model"
    if not (ct2_dir / "model.bin").exists():
        run([str(bin_dir / "ct2-opennmt-py-converter"), "--model_path", train_rec["model"], "--output_dir",
             str(ct2_dir), "--unsafe_deserialization", "--force"], env=s.env,
            log=s.work / "decode" / "ct2-convert.log", check="raise")
    out = s.work / "decode" / f"ct2-{ctype}"
    hyp = out.with_suffix(".hyp")
    p = run([str(bin_dir / "python"), str(HERE / "ct2_translate.py"), "--model", str(ct2_dir), "--spm",
             str(s.data / "spm.model"), "--input", str(s.data / "test.de"), "--output", str(hyp),
             "--compute-type", ctype, "--beam-size", "5", "--batch-size", str(s.decode_batch),
             "--threads", str(s.threads), "--max-length", str(MAX_OUTPUT)], env=s.env, log=out.with_suffix(".log"),
            check="raise")
    info = json.loads(p.output.strip().splitlines()[-1])
    return _decode_record(f"CTranslate2 {ctype}", f"OpenNMT-py, {train_rec['label']}", p, info["decode_seconds"], hyp, s)


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def decode_jobs(s: Setting, models: dict[str, dict], train: dict[str, dict]) -> tuple[dict, set]:
    """The translations of the table, in order (name -> job), and those run in the first round only:
    attnmt (fp32, bf16 where the CPU has bf16 kernels, int8), OpenNMT-py and eole with ``models``,
    CTranslate2 with the OpenNMT-py model, JoeyNMT with its last timed-round model (once: minutes
    long), attnmt's fully trained model if ``s.attnmt_model`` names one."""
    jobs: dict = {}
    if "attnmt" in models:
        for prec in ("fp32", "bf16", "int8") if s.bf16 else ("fp32", "int8"):
            jobs[f"attnmt {prec}"] = lambda prec=prec: decode_attnmt(s, Path(models["attnmt"]["model"]), prec,
                                                                     "attnmt-bench", models["attnmt"]["label"])
    if "onmt" in models:
        jobs["onmt"] = lambda: decode_onmt(s, models["onmt"])
        for ctype in ("float32", "int8"):
            jobs[f"ct2 {ctype}"] = lambda ctype=ctype: decode_ct2(s, models["onmt"], ctype)
    if "eole" in models:
        jobs["eole"] = lambda: decode_eole(s, models["eole"])
    if "joeynmt" in train:
        jobs["joeynmt"] = lambda: decode_joeynmt(s, train["joeynmt"]["last"])
    if s.attnmt_model is not None:
        for prec in ("fp32", "bf16") if s.bf16 else ("fp32",):
            jobs[f"trained {prec}"] = lambda prec=prec: decode_attnmt(s, s.attnmt_model, prec, "attnmt-trained",
                                                                      f"trained ({_rel(s.attnmt_model)})")
    return jobs, {"joeynmt"}


def fastest_rounds(s: Setting, jobs: dict, once: set, failures: list[str]) -> list[dict]:
    """Every job in ``s.decode_rounds`` alternating rounds (harness.alternate; ``once`` in the first
    only): each row's fastest round, every round's decode seconds under 'rounds'. A failed job is
    appended to ``failures``."""
    def guarded(name: str):
        def job():
            try:
                return jobs[name]()
            except (RuntimeError, json.JSONDecodeError, IndexError) as e:
                failures.append(f"decode {name}: {e}")
                print(f"[bench] FAILED: {e}", flush=True)
        return job
    return list(alternate({name: guarded(name) for name in jobs}, s.decode_rounds, "decode_s", once).values())
