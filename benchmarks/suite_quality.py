"""quality: the presets, the multilingual model, distillation, the fast preset, fine-tuning, control.

``--part presets``: trains (or resumes) each preset of ``configs/`` named by ``--presets`` into
``--runs``, then test_2016_flickr BLEU and chrF (``attnmt evaluate``; for word-level presets also
BLEU on word tokens and test perplexity from ``attnmt score``).

``--part multilingual``: a multilingual ``--model`` on every direction among de, en, fr, cs it
serves, BLEU / chrF on test_2016_flickr, zero-shot directions also pivoted through English.

``--part distill``: a distilled ``--student`` against its ``--teacher`` (a student's configuration
``.yaml`` is first distilled from the teacher into ``--runs``/NAME with ``attnmt distill``): test BLEU/chrF (teacher
beam 5, student greedy and beam 5), whole ``attnmt translate`` processes on ``--repeat`` copies
of test2016 natively and with the CTranslate2 engine on int8 exports (one batch on 2 threads, and
two batches at once of one thread), alternating rounds, model sizes, the int8 web export raw and
gzip-compressed.

``--part fast``: the fast preset's ``--fast`` model against the ``--default`` one: its beam size
and length penalty chosen on val (the smallest beam within ``--tolerance`` BLEU of the best), test
BLEU/chrF of both, and whole ``attnmt translate`` processes on ``--repeat`` copies of test2016.

``--part recipes``: the de-en preset with ``--set`` keys (named ``--recipe``) capped at N updates of
``--caps`` (1 thread: two at once keep their result) and at N = 0 its own budget (alone).

``--part finetune`` and ``--part control``: see quality_finetune.py and quality_control.py.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import harness as h
import quality_control
import quality_finetune

PRESETS = ("multi30k_de_en", "multi30k_en_de", "multi30k_en_fr", "tutorial_word_de_en", "prenorm_frozen_de_en",
           "spm_base_fr_en", "paper_base_de_en")
PARTS = {name: ["--part", name] for name in ("presets", "multilingual", "distill", "fast", "recipes", "finetune",
                                             "control")}
SMOKE = {"limit": 8, "repeat": 1, "rounds": 1, "beams": "1,2", "alphas": "1.0", "inference_precisions": "fp32,int8",
         "caps": "8,0", "runs": lambda args: args.work / "smoke", "sentences": 5, "updates": 4, "valid_every": 2,
         "batch_tokens": 1000, "set": h.tiny_sets() + ["data.valid_max_sentences=20", "train.num_threads=1"],
         **{name: h.smoke_model for name in ("model", "teacher", "student", "default", "fast")}}
MODELS = ("model", "teacher", "student", "baseline", "default", "fast")
PRECISION = {"fp32": "float32", "bf16": "bf16", "int8": "int8 linear layers"}


def add_arguments(p) -> None:
    p.add_argument("--part", choices=PARTS, default="presets")
    p.add_argument("--presets", default=",".join(PRESETS), help="presets: comma-separated names of configs/NAME.yaml")
    p.add_argument("--runs", type=Path, default=h.WORK / "presets",
                   help="where the presets' runs go (a model option naming configs/NAME.yaml is trained into NAME)")
    p.add_argument("--inference-precisions", default="", help="presets: also test at these, e.g. fp32,bf16,int8")
    p.add_argument("--model", type=Path, help="multilingual, control: the model directory")
    p.add_argument("--bilingual", action="append", default=[], metavar="SRC-TGT=DIR",
                   help="multilingual: a bilingual model of one direction to compare with")
    p.add_argument("--teacher", type=Path, help="distill: the teacher")
    p.add_argument("--student", type=Path, help="distill: the student")
    p.add_argument("--baseline", type=Path, help="distill: the student's architecture on the original targets")
    p.add_argument("--default", type=Path, help="fast: the default preset's model")
    p.add_argument("--fast", type=Path, help="fast: the fast preset's model")
    p.add_argument("--default-beam", type=int, default=5)
    p.add_argument("--default-alpha", type=float, default=1.8)
    p.add_argument("--beams", default="1,2,3,5", help="fast: the beam sizes tried on val")
    p.add_argument("--alphas", default="1.0,1.4,1.8", help="fast: the length penalties tried on val")
    p.add_argument("--tolerance", type=float, default=0.3, help="fast: val BLEU a smaller beam may lose")
    p.add_argument("--repeat", type=int, default=3, help="distill, fast: copies of test2016 timed")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds; the fastest kept")
    p.add_argument("--limit", type=int, help="only the first N test (and val) sentences")
    p.add_argument("--recipe", default="preset", help="recipes: the name of the preset with these --set keys")
    p.add_argument("--caps", default="2500,0", help="recipes: update caps (0: the preset's own budget)")
    quality_finetune.add_arguments(p)
    quality_control.add_arguments(p)


def test_files(args, out: Path, repeat: int = 1) -> tuple[Path, Path, Path]:
    """test_2016_flickr de and en (first ``--limit`` lines) and the source ``repeat`` times, in ``out``."""
    src = h.read_lines(h.corpus(args, "test_2016_flickr", "de"), args.limit)
    ref = h.read_lines(h.corpus(args, "test_2016_flickr", "en"), args.limit)
    return (h.write_lines(out / "test.de", src), h.write_lines(out / "test.en", ref),
            h.write_lines(out / "test_x.de", src * repeat))


def preset(args, config: Path, run_dir: Path, *options) -> dict:
    """Train (or resume) ``config`` with ``options`` into ``run_dir`` unless it finished, its word vectors
    first where it names them (``attnmt train-vectors``): its "done" log record."""
    from attnmt.config import load_config

    cfg = load_config(config)
    for side, path in (("src", cfg.model.src_vectors), ("tgt", cfg.model.tgt_vectors)):
        if path and not (h.ROOT / path).exists():
            h.run(h.attnmt("train-vectors", config, "--side", side, "--output", path, "--data-dir", args.data))
    return h.last(h.trained(args, config, run_dir, *options), "done")


def model_of(args, path: Path | None) -> Path | None:
    """``path``, or for a preset's config (``configs/NAME.yaml``) its run ``--runs``/NAME, trained first."""
    if path is None or path.suffix != ".yaml":
        return path
    preset(args, path, args.runs / path.stem)
    return args.runs / path.stem


def scores(args, section: str, figure: str, s: dict, prefix: str = "", **settings) -> None:
    """Record BLEU and chrF of ``s`` (attnmt evaluate's or corpus_scores' dict) as two columns."""
    for name, unit in (("bleu", "BLEU"), ("chrf", "chrF")):
        h.record(args, section, figure, f"{prefix}test {unit}", round(s[name], 2), unit, **settings)


def presets(args) -> None:
    """Train (or resume) and test each preset."""
    from attnmt.config import load_config

    section = "Translation quality, the presets"
    for name in ["smoke"] if args.smoke else args.presets.split(","):
        config = h.ROOT / "configs" / f"{name}.yaml"
        run_dir = args.runs / name
        if args.smoke:
            config = h.small_config(args, args.work / "smoke" / "preset")
            run_dir = args.work / "smoke" / "preset-run"
        cfg = load_config(config)
        src, tgt = cfg.data.pair.split("-") if cfg.data.pair else ("de", "en")
        done = preset(args, config, run_dir)
        test = [h.write_lines(run_dir / f"test.{x}", h.read_lines(h.corpus(args, "test_2016_flickr", x), args.limit))
                for x in (src, tgt)]
        result = h.evaluate(run_dir, *test)
        figure = f"{name} ({done.get('precision')})"
        scores(args, section, figure, result)
        h.record(args, section, figure, "updates", done["steps"], "updates")
        h.record(args, section, figure, "minutes", round(done["minutes"]), "min")
        if "bleu_tokenized" in result:
            p = h.run(h.attnmt("score", "--model", run_dir, "--src", test[0], "--tgt", test[1], "--format", "jsonl"))
            h.record(args, section, figure, "word-token BLEU", round(result["bleu_tokenized"], 2), "BLEU")
            h.record(args, section, figure, "test perplexity", round(json.loads(p.output.strip().splitlines()[-1])
                                                                     ["perplexity"], 2), "perplexity")
        for precision in filter(None, args.inference_precisions.split(",")):  # the same model at each precision
            result = h.evaluate(run_dir, *test, "--precision", precision, "--device", "cpu")
            scores(args, "Inference precision", f"{figure}, {PRECISION.get(precision, precision)}", result)


def multilingual(args) -> None:
    """Every direction of a multilingual model, zero-shot ones also through English."""
    from attnmt.decode.translator import Translator
    from attnmt.evaluate import corpus_scores
    from attnmt.languages import corpus_directions, served_languages

    tr = Translator.from_dir(h.model_dir(args.model))
    sources, targets = served_languages(tr.config)
    if len(targets) == 1:
        return many_to_one(args, tr, sources, targets[0])
    langs = [x for x in ("de", "en", "fr", "cs") if x in set(sources) | set(targets)]
    text = {x: h.read_lines(h.corpus(args, "test_2016_flickr", x), args.limit) for x in langs}
    trained = {d for d in corpus_directions(tr.config) if None not in d}
    bilingual = dict(item.split("=", 1) for item in args.bilingual)

    section = "One model for six directions: the multilingual preset"
    for src in (x for x in langs if x in sources):
        for tgt in (x for x in langs if x in targets and x != src):
            rows = {"": [t.text for t in tr.translate(text[src], tgt_lang=tgt)]}
            if (src, tgt) not in trained and "en" not in (src, tgt) and "en" in targets:
                english = [t.text for t in tr.translate(text[src], tgt_lang="en")]
                rows["pivot via en, "] = [t.text for t in tr.translate(english, tgt_lang=tgt)]
            if f"{src}-{tgt}" in bilingual:
                rows["bilingual, "] = [t.text for t in Translator.from_dir(bilingual[f"{src}-{tgt}"]).translate(text[src])]
            for prefix, hyps in rows.items():
                scores(args, section, f"{src}->{tgt}", corpus_scores(hyps, text[tgt]), prefix,
                       sentences=len(text[src]), zero_shot=(src, tgt) not in trained)


def many_to_one(args, tr, sources: list[str], tgt: str) -> None:
    """Several sources into one target: each direction's test BLEU / chrF and updates, minutes (train_log.jsonl),
    beside a bilingual model of that direction (``--bilingual``); each model's own decoding settings."""
    from attnmt.decode.translator import Translator
    from attnmt.evaluate import corpus_scores

    bilingual, ref = dict(i.split("=", 1) for i in args.bilingual), h.read_lines(h.corpus(args, "test_2016_flickr", tgt))

    section = "Many to English: one model with a low-resource direction"
    for src in sources:
        for name, run_dir, model in (("one model", args.model, tr), ("bilingual", bilingual.get(f"{src}-{tgt}"), None)):
            if not run_dir:
                continue
            model = model or Translator.from_dir(run_dir)
            hyps = [t.text for t in model.translate(h.read_lines(h.corpus(args, "test_2016_flickr", src)))]
            scores(args, section, f"{src}->{tgt}", corpus_scores(hyps, ref), f"{name}: ")
            done = h.last(h.train_log(run_dir), "done") if (Path(run_dir) / "train_log.jsonl").is_file() else None
            if done:
                h.record(args, section, f"{src}->{tgt}", f"{name}: updates", done["steps"], "updates")
                h.record(args, section, f"{src}->{tgt}", f"{name}: training minutes", round(done["minutes"]), "min")


def site_bytes(site: Path) -> tuple[int, int]:
    """Raw and gzip-compressed bytes of every file of an exported web page."""
    files = [p for p in site.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), sum(len(gzip.compress(p.read_bytes(), 6)) for p in files)


def timed(args, rows: dict, src: Path, ref: Path, out: Path) -> dict:
    """Whole ``attnmt translate`` processes of ``rows`` (name -> model, beam, options), alternating rounds."""
    def job(name: str):
        model, beam, options = rows[name]
        return lambda: h.translate(model, src, out / f"{abs(hash(name))}.hyp", beam=beam, **options)
    best = h.alternate({name: job(name) for name in rows}, args.rounds)
    for res in best.values():
        res["bleu"] = h.bleu(res["output"], ref)["bleu"]
    return best


def distill(args) -> None:
    """A distilled student against its teacher: quality, speed, size."""
    section = "Distillation: de-en teacher and student"
    out = args.work / args.suite / "distill"
    src, ref, repeated = test_files(args, out, args.repeat)
    models = {"teacher": h.model_dir(args.teacher, "--teacher"), "student": h.model_dir(args.student, "--student"), **({"baseline": args.baseline} if args.baseline else {})}
    for name, model in models.items():
        for beam in (5,) if name == "teacher" else (1, 5):
            scores(args, section, f"{name}, beam {beam}", h.evaluate(model, src, ref, "--beam-size", beam))
    exports = {}
    for name in ("teacher", "student"):
        exports[name] = out / f"{name}-ct2-int8"
        h.run(h.attnmt("export", "ctranslate2", "--model", models[name], "--output", exports[name],
                       "--quantization", "int8"))
        h.record(args, section, name, "size: safetensors",
                 round((models[name] / "model.safetensors").stat().st_size / 2**20, 2), "MiB")
        h.record(args, section, name, "size: CTranslate2 int8 model.bin",
                 round((exports[name] / "model.bin").stat().st_size / 2**20, 2), "MiB")
    site = out / "student-web-int8"
    h.run(h.attnmt("export", "web", "--model", args.student, "--output", site, "--quantization", "int8"))
    raw, packed = site_bytes(site)
    h.record(args, section, "student, int8 web export", "size: raw", round(raw / 2**20, 2), "MiB")
    h.record(args, section, "student, int8 web export", "size: gzip", round(packed / 2**20, 2), "MiB")
    two = {"inter_threads": 2, "threads": 1}
    rows = {"teacher, beam 5, native fp32": (models["teacher"], 5, {}),
            "student, greedy, native fp32": (models["student"], 1, {}),
            "teacher, beam 5, CTranslate2 int8": (exports["teacher"], 5, {"engine": "ctranslate2"}),
            "student, greedy, CTranslate2 int8": (exports["student"], 1, {"engine": "ctranslate2"}),
            "teacher, beam 5, CTranslate2 int8, 2 batches at once": (exports["teacher"], 5, {"engine": "ctranslate2", **two}),
            "student, greedy, CTranslate2 int8, 2 batches at once": (exports["student"], 1, {"engine": "ctranslate2", **two})}
    best = timed(args, rows, repeated, ref, out)
    lines = len(h.read_lines(repeated))
    for name, res in best.items():
        for column, value, unit in (("process s", round(res["seconds"], 2), "s"),
                                    ("decode s", round(res["decode_seconds"], 2), "s"), ("BLEU", round(res["bleu"], 2), "BLEU")):
            h.record(args, section, name, column, value, unit, lines=lines)
    for engine in ("native fp32", "CTranslate2 int8", "CTranslate2 int8, 2 batches at once"):
        t, s = best[f"teacher, beam 5, {engine}"], best[f"student, greedy, {engine}"]
        h.record(args, section, f"teacher / student, {engine}", "speed-up, process", round(t["seconds"] / s["seconds"], 2),
                 "times")
        h.record(args, section, f"teacher / student, {engine}", "speed-up, decode",
                 round(t["decode_seconds"] / s["decode_seconds"], 2), "times")


def fast(args) -> None:
    """The fast preset against the default: settings chosen on val, test quality, speed."""
    section = "The fast preset against the default"
    h.model_dir(args.default, "--default")
    h.model_dir(args.fast, "--fast")
    out = args.work / args.suite / "fast"
    src, ref, repeated = test_files(args, out, args.repeat)
    val = [h.write_lines(out / f"val.{x}", h.read_lines(h.corpus(args, "val", x), args.limit)) for x in ("de", "en")]

    def options(alpha: float) -> tuple:
        return ("--length-penalty", alpha, "--early-stopping", "true")
    val_bleu = {(b, a): h.evaluate(args.fast, *val, "--beam-size", b, *options(a))["bleu"]
                for b in map(int, args.beams.split(",")) for a in map(float, args.alphas.split(","))}
    top = max(val_bleu.values())
    beam, _, alpha = min((b, -s, a) for (b, a), s in val_bleu.items() if s >= top - args.tolerance)
    settings = {"default": (args.default, args.default_beam, args.default_alpha), "fast": (args.fast, beam, alpha)}
    tests = {name: h.evaluate(m, src, ref, "--beam-size", b, *options(a)) for name, (m, b, a) in settings.items()}
    best = timed(args, {name: (m, b, {"length_penalty": a, "early_stopping": "true"})
                        for name, (m, b, a) in settings.items()}, repeated, ref, out)
    for name, (model, beam, alpha) in settings.items():
        figure = {"default": "the default's model, its own beam and length penalty",
                  "fast": "multi30k_de_en_fast, beam and length penalty chosen on val"}[name]
        scores(args, section, figure, tests[name])
        for column, value, unit in (("beam size", beam, "beams"), ("length penalty", alpha, "alpha"),
                                    ("process s", round(best[name]["seconds"], 2), "s")):
            h.record(args, section, figure, column, value, unit, lines=len(h.read_lines(repeated)))


def recipes(args) -> None:
    """A recipe of the de-en preset, capped at a number of updates and at its own budget."""
    section = "Recipes of multi30k_de_en"
    config = h.small_config(args, args.work / "smoke" / "recipe") if args.smoke else \
        h.ROOT / "configs" / "multi30k_de_en.yaml"
    test = test_files(args, args.work / args.suite / "recipes")[:2]
    figure = f"{args.recipe} ({', '.join(args.set) or 'the preset'})"
    for cap in map(int, args.caps.split(",")):
        capped = h.set_args(h.capped(cap) + ["train.num_threads=1"]) if cap else []
        run_dir = args.runs / f"recipe-{args.recipe}-{cap}"
        logged = h.trained(args, config, run_dir, *h.set_args(args.set), *capped)
        done = h.last(logged, "done")
        val = {r["step"]: r["valid_bleu"] for r in logged if r["kind"] == "valid"}
        prefix = f"{cap:,} updates: " if cap else "own budget: "
        if not cap:
            h.record(args, section, figure, prefix + "updates", done["steps"], "updates")
        for step in (cap,) if cap else (2500, 4500):
            if step in val:
                h.record(args, section, figure, prefix + ("val BLEU" if cap else f"val BLEU at {step:,}"),
                         round(val[step], 2), "BLEU")
        if not cap:
            h.record(args, section, figure, prefix + "kept val BLEU", round(done["best_valid_bleu"], 2), "BLEU")
        scores(args, section, figure, h.evaluate(run_dir, *test), prefix)
        if not cap:
            h.record(args, section, figure, prefix + "tgt tok/s", round(done["tgt_tokens_per_second"]), "tok/s")


def distilled(args, config: Path, teacher: Path) -> Path:
    """``attnmt distill CONFIG --teacher TEACHER`` into ``--runs``/NAME, reused when it finished with the same
    configuration and teacher at this clean commit (harness.stamp), resumed when interrupted."""
    run_dir = args.runs / config.stem
    wanted = h.stamp(args, config, ["--teacher", teacher])
    reused = h.reusable(run_dir, wanted)
    if not reused:
        stamp = run_dir / h.STAMP
        if run_dir.exists() and (wanted["dirty"] or not stamp.is_file()
                                 or json.loads(stamp.read_text(encoding="utf-8")) != wanted):
            shutil.rmtree(run_dir)  # another configuration, teacher or commit, or uncommitted code: distil again
        run_dir.mkdir(parents=True, exist_ok=True)
        h.atomic_json(run_dir / h.STAMP, wanted)
        h.run(h.attnmt("distill", config, "--teacher", teacher, "--output", run_dir, "--data-dir", args.data))
    h.note_model(args, run_dir, reused=reused)
    return run_dir


def run(args) -> None:
    if args.part == "distill" and args.student is not None and args.student.suffix == ".yaml":
        args.student = distilled(args, args.student, model_of(args, args.teacher))
    for name in MODELS:
        setattr(args, name, model_of(args, getattr(args, name)))
    {"presets": presets, "multilingual": multilingual, "distill": distill, "fast": fast, "recipes": recipes,
     "finetune": quality_finetune.run, "control": quality_control.run}[args.part](args)
