"""The whole record as a fixed list of steps: what ``python -m benchmarks all`` runs, in order.

A step is one ``python -m benchmarks ...`` command (or one ``attnmt`` command that makes a model a
later step measures), its estimated wall minutes on a 2-core CPU and why it is as long as it is.
Two kinds:

- *training* steps train a model for its own time budget (the presets' 56 minutes) or a fixed number
  of updates; each is one command, run by ``all --step NAME`` alone, and skipped by ``all`` when the
  model it writes was trained to its end from the same configuration at the same clean commit (the
  stamp of :mod:`harness`: the records of the step's suite command then say ``reused``);
- *parts* measure with models the training steps made, and are what the four hours of ``all`` are for.

The estimates are read off the code's settings (updates, rounds, lines, seconds) and the rates the
records of a 2-core EPYC showed (an update of the de-en preset: 0.43 s in bfloat16 on 2 threads,
1.0 s in float32; 1,000 test sentences at beam 5: about 20 s natively, 10 s with CTranslate2); they
are estimates, printed by ``all --dry-run`` so that the budget is visible before anything runs.
Parts left at their suites' default lengths are listed in ``SPREAD_UNKNOWN``: shortening them needs
two runs of each length to show the shorter one's figure lies within the run-to-run spread, which
only a machine measuring alone can give.
"""

from __future__ import annotations

from dataclasses import dataclass

RUNS = "runs"  # the models the training steps write, at the repository root (gitignored)
PRESET = f"{RUNS}/multi30k_de_en"  # README command 1's preset, trained by the quality suite's presets part


@dataclass(frozen=True)
class Step:
    """One command of the record: ``argv`` after ``python -m benchmarks`` (``attnmt`` commands start with
    "attnmt"), its estimated minutes on 2 cores, ``training`` or ``part``, the model folders it needs
    (made by earlier steps) and the one it writes, and why it is as long as it is."""

    name: str
    kind: str
    argv: tuple[str, ...]
    minutes: float
    why: str
    needs: tuple[str, ...] = ()
    writes: str = ""

    def command(self) -> str:
        """The command line as a user types it."""
        head = [] if self.argv[0] == "attnmt" else ["python", "-m", "benchmarks"]
        return " ".join([*head, *self.argv])


def _recipe(name: str, caps: str, minutes: float, *sets: str) -> Step:
    keys = tuple(x for s in sets for x in ("--set", s))
    budget = {"2500": "capped at 2,500 updates on 1 thread (about 0.8 s an update)",
              "0": "at its own 56-minute budget", "2500,0": "capped at 2,500 updates on 1 thread, then at its own "
              "56-minute budget"}[caps]
    return Step(f"recipe-{name}", "training", ("quality", "--part", "recipes", "--recipe", name, *keys,
                                               *(("--caps", caps) if caps != "2500,0" else ()), "--runs", RUNS),
                minutes, f"the preset with one change {budget}; test_2016 at beam 5 after each")


STEPS: tuple[Step, ...] = (
    # trainings: each one command, a model the parts below read
    Step("preset", "training", ("quality", "--part", "presets", "--presets", "multi30k_de_en", "--runs", RUNS,
                                "--inference-precisions", "fp32,bf16,int8"), 60,
         "README command 1's preset, its 56-minute budget, then test_2016 at three inference precisions",
         writes=PRESET),
    Step("fast-preset", "training", ("quality", "--part", "fast", "--default", PRESET, "--fast",
                                     "configs/multi30k_de_en_fast.yaml", "--runs", RUNS), 75,
         "the fast preset's 56 minutes, 12 val evaluations (4 beams x 3 length penalties), 2 rounds on 3,000 lines",
         needs=(PRESET,), writes=f"{RUNS}/multi30k_de_en_fast"),
    Step("cs-en-lowres", "training", ("quality", "--part", "presets", "--presets", "multi30k_cs_en_lowres",
                                      "--runs", RUNS), 50,
         "the bilingual low-resource cs->en model of the many-to-English comparison: 2,000 updates",
         writes=f"{RUNS}/multi30k_cs_en_lowres"),
    Step("many-to-en", "training", ("quality", "--part", "multilingual", "--model", "configs/multi30k_many_to_en.yaml",
                                    "--runs", RUNS, "--bilingual", f"cs-en={RUNS}/multi30k_cs_en_lowres"), 65,
         "56 minutes, then three directions of test_2016 (its de->en bilingual model is the constant-0.3 recipe's row)",
         needs=(f"{RUNS}/multi30k_cs_en_lowres",), writes=f"{RUNS}/multi30k_many_to_en"),
    Step("distill", "training", ("quality", "--part", "distill", "--teacher", PRESET, "--student",
                                 "configs/multi30k_de_en_student.yaml", "--runs", RUNS), 80,
         "the preset (the teacher) translates 29,000 lines, the student trains 56 minutes, 6 rows x 2 rounds "
         "on 3,000 lines", needs=(PRESET,), writes=f"{RUNS}/multi30k_de_en_student"),
    _recipe("curriculum", "2500", 35),  # its own budget is the preset's row
    _recipe("constant-0.3", "2500,0", 95, "train.dropout_curriculum=0"),
    _recipe("constant-0.2", "2500,0", 95, "train.dropout_curriculum=0", "model.dropout=0.2"),
    _recipe("subwords", "2500", 45, "train.dropout_curriculum=0", "train.subword_alpha=0.5"),
    _recipe("float32", "0", 60, "train.precision=fp32"),
    # parts: the four hours
    Step("peers", "part", ("train", "--part", "peers"), 60,
         "matmul probe; every toolkit 120 updates x 2 alternating rounds; attnmt and OpenNMT-py 600 updates for "
         "the translation table; 7 translations x 2 rounds of 1,000 lines, JoeyNMT once"),
    Step("compile", "part", ("train", "--part", "compile", "--precisions", "fp32", "bf16"), 25,
         "300 updates eager and compiled in each precision (the compile itself is minutes)"),
    Step("ddp", "part", ("train", "--part", "ddp"), 10, "300 updates under torchrun x2 and in one process"),
    Step("precision", "part", ("train", "--part", "precision"), 10,
         "300 updates in fp32 (about 1.0 s each) and in bf16 (0.43 s), then auto's timing (at most 12 s timed) "
         "and 1 update"),
    Step("engines", "part", ("translate", "--part", "engines", "--model", PRESET), 10,
         "the exports, then 8 rows x 2 rounds of 1,000 lines", needs=(PRESET,)),
    Step("stopping", "part", ("translate", "--part", "stopping", "--model", PRESET, "--parallel"), 18,
         "7 rows x 2 rounds of 3,000 lines, each early row again as two batches at once", needs=(PRESET,)),
    Step("documents", "part", ("translate", "--part", "documents", "--model", PRESET), 5,
         "1,000 sentences as lines and as 250 paragraphs x 2 rounds, the paragraphs unsplit, 1,000 in HTML with "
         "alignments, 1,000 words alone", needs=(PRESET,)),
    Step("serve", "part", ("serve", "--model", PRESET), 8,
         "5 s warm-up and 300 s of load, offline translation before and after", needs=(PRESET,)),
    Step("web", "part", ("web", "--model", PRESET), 35,
         "2 exports x 2 servers x 2 modes x 2 beams of 1,000 sentences in Chromium, native once per beam",
         needs=(PRESET,)),
    Step("corpora", "part", ("data", "--part", "corpora"), 25,
         "prepare 1, 10 and 100 copies of Multi30k; 3 trainings of 2 updates x 3 repeats each"),
    Step("simulate", "part", ("data", "--part", "simulate"), 10,
         "sparse corpora of 1M, 10M and 100M pairs: open, plan, 2 updates in 1 and 2 processes"),
    Step("finetune", "part", ("quality", "--part", "finetune"), 20, "about 2,000 updates in four runs, evaluations"),
    Step("control", "part", ("quality", "--part", "control", "--model", PRESET), 6,
         "200 constrained sentences, alignments of 9 pairs per layer, one streamed sentence", needs=(PRESET,)),
)

# Parts at their suites' default lengths: their spread is unknown until measured alone twice.
SPREAD_UNKNOWN = ("peers", "compile", "serve", "web", "corpora")


def select(names: list[str] | None) -> list[Step]:
    """The steps named (all of them, in order, when ``names`` is empty); an unknown name raises KeyError."""
    if not names:
        return list(STEPS)
    by_name = {s.name: s for s in STEPS}
    for name in names:
        if name not in by_name:
            raise KeyError(name)
    return [s for s in STEPS if s.name in names]


def listing(steps: list[Step]) -> list[str]:
    """The plan as lines: each step's estimate, kind, name and command; then the totals of each kind."""
    out = []
    for s in steps:
        out.append(f"{s.minutes:5.0f} min  {s.kind:8s} {s.name:14s} {s.command()}")
        out.append(f"{'':25s}{s.why}")
    for kind in ("training", "part"):
        total = sum(s.minutes for s in steps if s.kind == kind)
        out.append(f"{kind}s: {total:.0f} min ({total / 60:.1f} h) on 2 cores, estimated")
    return out
