"""``python -m benchmarks all`` and the rules of the record: the plan and its commands, the refusal of a
tree with uncommitted changes, the load kept in each record, models reused by their stamp, and the
records ``report`` refuses because they could not be true (``benchmarks/checks.py``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.__main__ import main, parser  # noqa: E402

import harness  # noqa: E402  (the driver put benchmarks/ on sys.path)
import plan  # noqa: E402
import run_all  # noqa: E402
import stamps  # noqa: E402

COMMIT = "95b94cb246588a76bbb0a15c3d0ed1204194abe0"  # a commit of this repository, 2026-11-27
RECORD = {"suite": "quality", "section": "Translation quality, the presets", "figure": "multi30k_de_en (bf16)",
          "column": "test BLEU", "value": 43.27, "unit": "BLEU",
          "machine": {"vendor": "AuthenticAMD", "family": "26", "model": "2", "flags": ["avx2"], "cores": 2},
          "date": "2026-11-27T20:00:00+00:00", "commit": COMMIT,
          "command": "python -m benchmarks quality --part presets --presets multi30k_de_en --runs runs"}


def exit_code(argv: list[str], capsys) -> tuple[int, list[str], list[str]]:
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err.splitlines()


def test_the_dry_run_lists_every_step_with_its_minutes_and_the_totals(capsys):
    code, out, err = exit_code(["all", "--dry-run"], capsys)
    assert code == 0, err
    for step in plan.STEPS:
        assert any(step.command() in line and f"{step.minutes:.0f} min" in line for line in out), step.name
    parts = sum(s.minutes for s in plan.STEPS if s.kind == "part")
    assert f"parts: {parts:.0f} min ({parts / 60:.1f} h) on 2 cores, estimated" in out
    code, out, _ = exit_code(["all", "--dry-run", "--skip-trainings"], capsys)
    assert not any(" training " in line for line in out) and any(" part " in line for line in out)


def test_an_unknown_step_is_one_line(capsys):
    code, _, err = exit_code(["all", "--dry-run", "--step", "nonsense"], capsys)
    assert code == 2 and len(err) == 1 and "--step nonsense: no such step" in err[0]


def test_every_step_is_a_valid_command_of_the_driver_and_its_parts_exist():
    for step in plan.STEPS:
        args = parser().parse_args(list(step.argv))  # exits 2 on an unknown option or part
        assert args.suite in ("train", "translate", "serve", "web", "data", "quality"), step.name


def test_every_section_names_a_command_of_the_plan():
    """RESULTS.md tells the reader how to measure a section: a command ``all`` runs, not another one."""
    commands = {s.command() for s in plan.STEPS}
    sections = json.loads((REPO / "benchmarks" / "records" / "sections.json").read_text(encoding="utf-8"))
    for s in sections:
        assert s["command"] in commands, s["title"]
    steps = {s.name for s in plan.STEPS}
    assert set(plan.SPREAD_UNKNOWN) <= steps


def test_a_part_whose_model_is_missing_names_the_training_step(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(harness, "ROOT", tmp_path)
    monkeypatch.setattr(run_all.h, "ROOT", tmp_path)
    lines = run_all.missing_models(plan.select(["engines"]))
    assert lines == ["step engines needs runs/multi30k_de_en: run its training first "
                     "(python -m benchmarks all --step preset)"]
    assert run_all.missing_models(plan.select(["preset", "engines"])) == []


def test_a_tree_with_uncommitted_changes_is_refused_unless_allowed(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(harness, "commit", lambda: (COMMIT, True))
    code, _, err = exit_code(["all", "--step", "control"], capsys)
    assert code == 2 and len(err) == 1 and "uncommitted changes" in err[0] and "--allow-dirty" in err[0], err
    # a suite storing records: refused before any work (its data folder is real, nothing is trained)
    data = tmp_path / "data"
    (data / "multi30k").mkdir(parents=True)
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("de", "en"):
            (data / "multi30k" / f"{split}.{lang}.gz").write_bytes(b"")
    argv = ["data", "--part", "simulate", "--data", str(data), "--records", str(tmp_path / "rec"),
            "--work", str(tmp_path / "work")]
    code, _, err = exit_code(argv, capsys)
    assert code == 2 and len(err) == 1 and "uncommitted changes" in err[0], err
    assert not (tmp_path / "work").exists() and not (tmp_path / "rec" / "data.jsonl").exists()


def test_a_busy_machine_is_said_and_the_load_is_kept_in_each_record(monkeypatch, tmp_path):
    monkeypatch.setattr("os.getloadavg", lambda: (3.0, 1.0, 1.0))
    load = harness.load_per_core()
    assert load == round(3.0 / harness.psutil.cpu_count(logical=True), 2)
    assert harness.busy_line(0.5) is None and "busy" in harness.busy_line(0.51)
    args = argparse.Namespace(suite="quality", machine=RECORD["machine"], date=RECORD["date"], commit=COMMIT,
                              dirty=False, command=RECORD["command"], no_record=False, smoke=False,
                              records=tmp_path, load=0.9)
    rec = harness.record(args, RECORD["section"], RECORD["figure"], "test BLEU", 43.27, "BLEU")
    stored = json.loads((tmp_path / "quality.jsonl").read_text(encoding="utf-8"))
    assert rec["load"] == stored["load"] == 0.9
    main(["report", "--records", str(tmp_path), "--output", str(tmp_path / "R.md")])
    assert "(load 0.90 per core)" in (tmp_path / "R.md").read_text(encoding="utf-8")


def finished_run(run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train_log.jsonl").write_text(json.dumps({"kind": "done", "steps": 3}) + "\n", encoding="utf-8")


def test_a_model_is_reused_only_at_the_same_clean_commit_and_configuration(tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("model: {}\n", encoding="utf-8")
    clean = argparse.Namespace(commit=COMMIT, dirty=False, data=tmp_path)
    run_dir = tmp_path / "run"
    finished_run(run_dir)
    wanted = stamps.stamp(clean, config, ["--set", "a=1"])
    stamps.atomic_json(run_dir / stamps.STAMP, wanted)
    assert stamps.reusable(run_dir, wanted)
    assert not stamps.reusable(run_dir, stamps.stamp(clean, config, ["--set", "a=2"]))
    assert not stamps.reusable(run_dir, stamps.stamp(argparse.Namespace(commit="0" * 40, dirty=False), config, []))
    assert not stamps.reusable(run_dir, {**wanted, "dirty": True})  # uncommitted code: never reused
    calls = []
    monkeypatch.setattr(harness, "run", lambda cmd, **kw: calls.append(cmd))
    harness.trained(clean, config, run_dir, "--set", "a=1")
    assert calls == [] and clean.models[str(run_dir)] == {"dir": "run", "reused": True, "trained_at": COMMIT,
                                                          "trained_dirty": False}  # no path of this machine
    config.write_text("model: {d_model: 8}\n", encoding="utf-8")  # another configuration: trained again, fresh
    monkeypatch.setattr(harness, "run", lambda cmd, **kw: (calls.append(cmd), finished_run(run_dir)))
    (run_dir / "stale.txt").write_text("from the other configuration", encoding="utf-8")
    harness.trained(clean, config, run_dir, "--set", "a=1")
    assert len(calls) == 1 and "--resume" not in calls[0] and clean.models[str(run_dir)]["reused"] is False
    assert not (run_dir / "stale.txt").exists() and stamps.reusable(run_dir, stamps.stamp(clean, config, ["--set", "a=1"]))


IMPOSSIBLE = [
    ({"date": "2099-01-01"}, "in the future"),
    ({"date": "2026-11-26"}, "before its commit"),
    ({"commit": "1" * 40}, "not in this repository's history"),
    ({"value": 143.2}, "outside 0-100"),
    ({"column": "MFU", "unit": "share", "value": 1.4}, "MFU 1.4: outside (0, 1]"),
    ({"column": "tgt tok/s", "unit": "tok/s", "value": 0}, "a rate must be above zero"),
    ({"column": "decode s", "unit": "s", "value": -1.0}, "below zero"),
    ({"column": "updates", "unit": "updates", "value": 7.5}, "not a positive whole number"),
    ({"command": "python -m benchmarks translate --part stopping --model runs/de-en --base-src BASE/src"},
     "names a placeholder (BASE/src)"),
]


@pytest.mark.parametrize("change, problem", IMPOSSIBLE, ids=[p for _, p in IMPOSSIBLE])
def test_a_record_that_could_not_be_true_is_one_line_naming_file_and_line(change, problem, tmp_path, capsys):
    path = tmp_path / "quality.jsonl"
    path.write_text(json.dumps({**RECORD, "figure": "other"}) + "\n" + json.dumps({**RECORD, **change}) + "\n",
                    encoding="utf-8")
    for argv in (["report"], ["report", "--check"]):
        code, _, err = exit_code([*argv, "--records", str(tmp_path), "--output", str(tmp_path / "R.md")], capsys)
        assert code == 2 and len(err) == 1 and f"{path}:2: " in err[0] and problem in err[0], err
    assert not (tmp_path / "R.md").exists()


def test_decode_seconds_over_process_seconds_and_one_run_twice_are_refused(tmp_path, capsys):
    rows = [{**RECORD, "section": "Inference engines", "figure": "native", "column": c, "unit": "s", "value": v}
            for c, v in (("process s", 10.0), ("decode s", 12.0))]
    (tmp_path / "translate.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code, _, err = exit_code(["report", "--records", str(tmp_path), "--output", str(tmp_path / "R.md")], capsys)
    assert code == 2 and len(err) == 1 and "translate.jsonl:2: decode s 12.0 is more than" in err[0], err
    (tmp_path / "translate.jsonl").unlink()
    one_run = [("test BLEU", 43.27, "BLEU"), ("test chrF", 62.4, "chrF"), ("updates", 7726, "updates")]
    rows = [{**RECORD, "column": c, "value": v, "unit": u} for c, v, u in one_run]
    rows += [{**RECORD, "section": "Recipes of multi30k_de_en", "figure": "curriculum", "column": f"own budget: {c}",
              "value": v, "unit": u} for c, v, u in one_run]
    (tmp_path / "quality.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code, _, err = exit_code(["report", "--check", "--records", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1 and "quality.jsonl:4:" in err[0] and "one run shown twice" in err[0], err
    rows[-1]["value"] = 7725  # another run: two rows
    (tmp_path / "quality.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert exit_code(["report", "--records", str(tmp_path), "--output", str(tmp_path / "R.md")], capsys)[0] == 0


def test_no_records_writes_no_report(tmp_path, capsys):
    for argv in (["report"], ["report", "--check"]):
        code, _, err = exit_code([*argv, "--records", str(tmp_path), "--output", str(tmp_path / "R.md")], capsys)
        assert code == 2 and len(err) == 1 and "no records" in err[0], err
    assert not (tmp_path / "R.md").exists()


def test_records_written_by_one_step_leave_the_tree_clean_for_the_next(monkeypatch, tmp_path):
    """``all`` runs step after step in one checkout: the records the first writes are not code, so the
    second still measures a clean commit; a changed source file is still uncommitted code."""
    import subprocess

    import host

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    (tmp_path / "benchmarks" / "records").mkdir(parents=True)
    (tmp_path / "benchmarks" / "records" / "quality.jsonl").write_text("{}\n")
    (tmp_path / "benchmarks" / "RESULTS.md").write_text("# Results\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "c")
    monkeypatch.setattr(host, "ROOT", tmp_path)
    assert host.commit()[1] is False
    (tmp_path / "benchmarks" / "records" / "quality.jsonl").write_text("{}\n{}\n")
    (tmp_path / "benchmarks" / "RESULTS.md").write_text("# Results\n\nnew\n")  # what report rebuilds
    assert host.commit()[1] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert host.commit()[1] is True


def test_a_record_names_its_model_folder_without_a_path_of_the_machine(tmp_path):
    """Records are committed: a model folder is named relative to the checkout or the work folder."""
    assert stamps.shown(REPO / "runs" / "multi30k_de_en") == "runs/multi30k_de_en"
    assert stamps.shown(REPO / "benchmarks" / "work" / "train" / "x") == "benchmarks/work/train/x"
    assert stamps.shown(tmp_path / "w" / "train" / "m", tmp_path / "w") == "WORK/train/m"
    assert stamps.shown(tmp_path / "elsewhere" / "m", tmp_path / "w") == "m"


def test_a_step_waits_for_the_previous_steps_load_to_settle(monkeypatch, capsys):
    loads = iter([1.4, 0.9, 0.6, 0.4, 0.3])
    clock = iter(range(0, 1000, 5))
    monkeypatch.setattr(run_all.h, "load_per_core", lambda: next(loads))
    monkeypatch.setattr(run_all.time, "monotonic", lambda: next(clock))
    slept = []
    monkeypatch.setattr(run_all.time, "sleep", slept.append)
    assert run_all.settle(limit=180, poll=5) == 20
    assert slept == [5, 5, 5] and "waited 20 s" in capsys.readouterr().out
    monkeypatch.setattr(run_all.h, "load_per_core", lambda: 2.0)  # never settles: gives up at the limit
    assert run_all.settle(limit=30, poll=5) >= 30


@pytest.mark.parametrize("schedule", ["noam", "constant", "inverse_sqrt", "cosine_restarts", "time_budget"])
def test_a_part_switching_the_presets_schedule_gives_a_valid_configuration(schedule):
    """The parts that train a preset under another schedule (ddp: noam; compile, precision:
    constant) would be refused for the preset's time_budget keys (train.lr, train.budget_decay)."""
    import yaml

    from attnmt.config import apply_overrides, config_from_dict

    for preset in sorted((REPO / "configs").glob("multi30k_*.yaml")):
        raw = yaml.safe_load(preset.read_text(encoding="utf-8"))
        sets = [f"{key}={value}" for key, value in harness.schedule_sets(schedule).items()]
        config = config_from_dict(apply_overrides(raw, sets))
        assert config.train.schedule == schedule
