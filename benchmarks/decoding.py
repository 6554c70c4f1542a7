"""Translation runs and their scores: attnmt, JoeyNMT, OpenNMT-py and CTranslate2 on test_2016.

Every system translates raw text to raw text with beam 5; each row of the translation table
has the decode seconds as the toolkit reports them, the whole-process seconds, sacreBLEU and
the peak RSS. :func:`fastest_rounds` repeats the translations, the order alternating, and keeps
each row's fastest round (a shared machine's noise only ever slows a run).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from measure import Proc, run
from setting import HERE, MAX_OUTPUT, ROOT, Setting, peer_venv

Job = tuple[Callable[[], "dict | list[dict]"], bool]  # (translation, repeated in every round)


def bleu(hyp_path: Path, ref_path: Path) -> dict:
    """sacreBLEU of the detokenized hypotheses against the raw references, and its signature."""
    import sacrebleu

    hyps = hyp_path.read_text(encoding="utf-8").split("\n")[:-1]
    refs = ref_path.read_text(encoding="utf-8").split("\n")[:-1]
    if len(hyps) != len(refs):
        raise RuntimeError(f"{hyp_path}: {len(hyps)} lines for {len(refs)} references")
    b = sacrebleu.metrics.BLEU()
    score = b.corpus_score(hyps, [refs])
    return {"bleu": round(score.score, 2), "bleu_signature": str(b.get_signature())}


def _decode_record(name: str, model: str, p: Proc, decode_s: float, hyp: Path, s: Setting) -> dict:
    rec = {"system": name, "model": model, "decode_s": decode_s, "process_s": p.seconds, "peak_rss": p.peak_rss,
           "other_cores": p.other_cores, "hyp": str(hyp)}
    rec.update(bleu(hyp, s.data / "test.en"))
    print(f"[bench]   {name}: decode {decode_s:.2f} s, process {p.seconds:.1f} s, BLEU {rec['bleu']}", flush=True)
    return rec


def decode_attnmt(s: Setting, model: Path, precision: str, label: str, model_label: str) -> dict:
    """``attnmt translate`` of the test set at ``precision`` (fp32, bf16, int8)."""
    out = s.work / "decode" / f"{label}-{precision}"
    hyp = out.with_suffix(".hyp")
    p = run([str(ROOT / ".venv/bin/attnmt"), "translate", "--model", str(model), "--input", str(s.data / "test.de"),
             "--output", str(hyp), "--beam-size", "5", "--batch-size", str(s.decode_batch), "--threads",
             str(s.threads), "--precision", precision], out.with_suffix(".log"), env=s.env, nice=s.nice)
    m = re.search(r"translated \d+ lines in ([\d.]+) s", p.log.read_text(encoding="utf-8"))
    return _decode_record(f"attnmt {precision}", model_label, p, float(m.group(1)) if m else float("nan"), hyp, s)


def decode_joeynmt(s: Setting, train_rec: dict) -> dict:
    """JoeyNMT's translation of the test set with the model of ``train_rec``."""
    out = s.work / "decode" / "joeynmt"
    hyp = out.with_suffix(".hyp")
    py = peer_venv(s.work.parent, "joeynmt") / "bin/python"
    # JoeyNMT 2.3.0's translate fails writing to -o (AttributeError on args.n_best): stdout instead
    p = run([str(py), "-m", "joeynmt", "translate", train_rec["config"]], out.with_suffix(".log"),
            env=s.env, stdin=s.data / "test.de", nice=s.nice, stdout_file=hyp)
    m = re.search(r"Generation took ([\d.]+)\[sec\]", p.log.read_text(encoding="utf-8", errors="replace"))
    return _decode_record("JoeyNMT", f"{s.updates} updates", p, float(m.group(1)) if m else float("nan"), hyp, s)


def decode_onmt(s: Setting, train_rec: dict) -> dict:
    """OpenNMT-py's translation of the test set with the checkpoint of ``train_rec``."""
    out = s.work / "decode" / "onmt"
    hyp = out.with_suffix(".hyp")
    bin_dir = peer_venv(s.work.parent, "onmt") / "bin"
    p = run([str(bin_dir / "onmt_translate"), "-model", train_rec["model"], "-src", str(s.data / "test.de"),
             "-output", str(hyp), "-beam_size", "5", "-batch_size", str(s.decode_batch), "-batch_type", "sents",
             "-transforms", "sentencepiece", "-src_subword_model", str(s.data / "spm.model"),
             "-tgt_subword_model", str(s.data / "spm.model"), "-length_penalty", "wu", "-alpha", "0.6",
             "-max_length", str(MAX_OUTPUT), "-report_time", "-gpu", "-1"], out.with_suffix(".log"), env=s.env,
            nice=s.nice)
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
    """The OpenNMT-py checkpoint of ``train_rec`` converted to CTranslate2 and translating the
    test set in float32 and int8 (ct2_translate.py); the records and the conversion seconds."""
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
                 "--threads", str(s.threads), "--max-length", str(MAX_OUTPUT)], out.with_suffix(".log"), env=s.env,
                nice=s.nice, capture_stdout=True)
        info = json.loads(p.stdout.strip().splitlines()[-1])
        records.append(_decode_record(f"CTranslate2 {ctype}", f"OpenNMT-py, {train_rec['label']}", p,
                                      info["decode_seconds"], hyp, s))
    return records, convert_s


def _ct2(s: Setting, onmt_rec: dict, res: dict) -> list[dict]:
    records, convert_s = decode_ct2(s, onmt_rec)
    res["ct2_convert_s"] = convert_s
    return records


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def decode_jobs(s: Setting, models: dict[str, dict], train: dict[str, dict], res: dict) -> list[Job]:
    """The translations of the table, in order: attnmt (fp32, bf16 where the CPU has bf16
    kernels, int8) and OpenNMT-py with ``models``, CTranslate2 with the OpenNMT-py model (its
    conversion seconds go to ``res``), JoeyNMT with its last timed-round model (first round
    only: minutes long), attnmt's fully trained model if ``s.attnmt_model`` names one."""
    jobs: list[Job] = []
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
    return jobs


def fastest_rounds(s: Setting, jobs: list[Job], failures: list[str]) -> list[dict]:
    """Every job once per round for ``s.decode_rounds`` rounds, the order alternating between
    rounds (a job not repeated runs in the first only); one record per (system, model) row: the
    fastest round's, with every round's decode seconds under 'decode_rounds'. A failed job is
    appended to ``failures``."""
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
    return list(by_row.values())
