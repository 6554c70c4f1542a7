"""The benchmark records: validated (one line per bad record, exit 2), replaced by a rerun, and the
driver's one-line errors for every suite and part of the registry (``benchmarks/__main__.py``)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.__main__ import SUITES, main  # noqa: E402

from tests.conftest import multi30k_data  # noqa: E402

PARTS = [(suite, part, argv) for suite, module in SUITES.items() for part, argv in module.PARTS.items()]
IDS = [f"{suite} {part}" for suite, part, _ in PARTS]
RECORD = {"suite": "quality", "section": "Translation quality, the presets", "figure": "multi30k_de_en (bf16)",
          "column": "test BLEU", "value": 43.27, "unit": "BLEU",
          "machine": {"vendor": "AuthenticAMD", "family": "26", "model": "2", "flags": ["avx2"], "cores": 2},
          "date": "2026-11-27", "commit": "95b94cb246588a76bbb0a15c3d0ed1204194abe0", "dirty": True,
          "command": "python -m benchmarks quality --part presets --presets multi30k_de_en --runs runs"}


def exit_code(argv: list[str], capsys) -> tuple[int, list[str]]:
    """``python -m benchmarks ARGV`` in this process: its exit status and its stderr's lines."""
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().err.splitlines()


def write(folder: Path, name: str, lines: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return folder / name


def test_the_committed_records_are_valid_and_results_md_is_current(capsys):
    code, err = exit_code(["report", "--check"], capsys)
    assert code == 0, err
    for path in (REPO / "benchmarks" / "records").glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            value = rec["value"] if isinstance(rec["value"], list) else [rec["value"]]  # a number, or numbers (Record)
            assert "measured_with" not in rec and len(rec["commit"]) == 40
            assert value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value), line[:200]


@pytest.mark.parametrize("field", ["value", "unit", "commit", "machine", "command"])
def test_a_record_without_a_field_is_one_line_naming_file_and_line(field, tmp_path, capsys):
    good = json.dumps(RECORD)
    path = write(tmp_path, "quality.jsonl", [good, json.dumps({k: v for k, v in RECORD.items() if k != field})])
    for argv in (["report", "--records", str(tmp_path), "--output", str(tmp_path / "R.md")],
                 ["report", "--check", "--records", str(tmp_path), "--output", str(tmp_path / "R.md")]):
        code, err = exit_code(argv, capsys)
        assert code == 2 and len(err) == 1, err
        assert f"{path}:2: no {field}" in err[0]
    assert not (tmp_path / "R.md").exists()


@pytest.mark.parametrize("value", ["43.27 / 62.40", "**39.48**", None, [], float("nan"), 1e300, -1e300,
                                   float("inf"), True, 2**64, "abc", "", [1.0, 1e300]])
def test_prose_or_a_hostile_number_in_a_value_is_refused(value, tmp_path, capsys):
    from benchmarks.records import FIGURE

    path = write(tmp_path, "quality.jsonl", [json.dumps({**RECORD, "value": value})])
    code, err = exit_code(["report", "--records", str(tmp_path), "--output", str(tmp_path / "R.md")], capsys)
    assert code == 2 and err == [f"python -m benchmarks report: {path}:1: value: not {FIGURE.describe()} "
                                 "(or a list of them)"]


@pytest.mark.parametrize("cores", [0, -1, True, 2**64, 1e300, "abc"])
def test_a_hostile_core_count_is_refused(cores, tmp_path, capsys):
    path = write(tmp_path, "quality.jsonl", [json.dumps({**RECORD, "machine": {**RECORD["machine"], "cores": cores}})])
    code, err = exit_code(["report", "--records", str(tmp_path), "--output", str(tmp_path / "R.md")], capsys)
    assert code == 2 and len(err) == 1 and f"{path}:1: machine.cores" in err[0], err


@pytest.mark.parametrize("change", [{"commit": "95b94cb"}, {"commit": ""}, {"measured_with": "corpora.py"},
                                    {"command": "python benchmarks/corpora.py"}])
def test_a_short_commit_or_measured_with_is_refused(change, tmp_path, capsys):
    write(tmp_path, "quality.jsonl", [json.dumps({**RECORD, **change})])
    code, err = exit_code(["report", "--check", "--records", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1 and "quality.jsonl:1:" in err[0], err


def test_a_torn_line_is_one_line_exit_2(tmp_path, capsys):
    path = write(tmp_path, "quality.jsonl", [json.dumps(RECORD), json.dumps(RECORD)[:80]])
    code, err = exit_code(["report", "--check", "--records", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1 and f"{path}:2: not a JSON line" in err[0], err
    code, err = exit_code(["quality", "--records", str(tmp_path), "--data", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1 and f"{path}:2: not a JSON line" in err[0], err  # before any work


def test_two_records_of_one_table_differing_only_in_a_name_fail_the_check(tmp_path, capsys):
    out = tmp_path / "R.md"
    write(tmp_path, "quality.jsonl", [json.dumps(RECORD), json.dumps({**RECORD, "figure": "multi30k_de_en (BF16)"})])
    assert exit_code(["report", "--records", str(tmp_path), "--output", str(out)], capsys)[0] == 0
    code, err = exit_code(["report", "--check", "--records", str(tmp_path), "--output", str(out)], capsys)
    assert code == 1 and "differ only in spelling" in err[-1], err
    # one command on two dates under two names: the later run did not replace the earlier row
    renamed = {**RECORD, "figure": "multi30k_de_en, bf16", "date": "2026-11-28T01:00:00+00:00"}
    write(tmp_path, "quality.jsonl", [json.dumps(RECORD), json.dumps(renamed)])
    assert exit_code(["report", "--records", str(tmp_path), "--output", str(out)], capsys)[0] == 0
    code, err = exit_code(["report", "--check", "--records", str(tmp_path), "--output", str(out)], capsys)
    assert code == 1 and "rename or delete the older records" in err[-1], err
    write(tmp_path, "quality.jsonl", [json.dumps(renamed)])
    assert exit_code(["report", "--records", str(tmp_path), "--output", str(out)], capsys)[0] == 0
    assert exit_code(["report", "--check", "--records", str(tmp_path), "--output", str(out)], capsys)[0] == 0


@pytest.mark.parametrize("suite, part, argv", PARTS, ids=IDS)
def test_a_data_folder_missing_or_without_multi30k_is_one_line(suite, part, argv, tmp_path, capsys):
    for data, problem in ((tmp_path / "nothing", "no such folder"), (tmp_path, "no folder multi30k/")):
        code, err = exit_code([suite, *argv, "--data", str(data), "--work", str(tmp_path / "work")], capsys)
        assert code == 2 and len(err) == 1 and f"--data {data}: {problem}" in err[0], err


@pytest.mark.parametrize("suite, part, argv", PARTS, ids=IDS)
def test_no_data_offline_with_nothing_cached_is_one_line(suite, part, argv, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ATTNMT_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens: offline
    code, err = exit_code([suite, *argv, "--work", str(tmp_path / "work")], capsys)
    assert code == 2 and len(err) == 1 and "no Multi30k (give --data DIR or set ATTNMT_DATA" in err[0], err
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("suite, part, argv", [p for p in PARTS if SUITES[p[0]].MODELS], ids=[
    i for i, p in zip(IDS, PARTS) if SUITES[p[0]].MODELS])
def test_a_model_that_does_not_exist_is_one_line(suite, part, argv, tmp_path, capsys):
    option = "--" + SUITES[suite].MODELS[0].replace("_", "-")
    code, err = exit_code([suite, *argv, option, str(tmp_path / "no-model"), "--work", str(tmp_path / "w")], capsys)
    assert code == 2 and err == [f"python -m benchmarks {suite}: {option} {tmp_path / 'no-model'}: no such model directory"]


def table_rows(results_md: Path) -> list[str]:
    lines = results_md.read_text(encoding="utf-8").splitlines()
    return [line for line, above in zip(lines[1:], lines) if line.startswith("| ") and above.startswith("| ---")
            or line.startswith("| ") and above.startswith("| ") and not line.startswith("| ---")]


def test_a_rerun_replaces_its_records(tmp_path, capsys):
    """data --part simulate at a real (not --smoke) size, twice into one records folder: the second run's
    records replace the first's, one for one."""
    if multi30k_data() is None:
        pytest.skip("needs ATTNMT_DATA (the folder holding multi30k/)")
    records = tmp_path / "records"
    records.mkdir()
    argv = ["data", "--part", "simulate", "--sizes", "20000", "--skip", "plan2", "train", "torchrun",
            "--records", str(records), "--work", str(tmp_path / "work")]
    runs = []
    for _ in range(2):  # --allow-dirty: a checkout under development; it is left out of the recorded command
        assert exit_code([*argv, "--allow-dirty"], capsys)[0] == 0
        assert exit_code(["report", "--records", str(records), "--output", str(tmp_path / "R.md")], capsys)[0] == 0
        runs.append(([json.loads(x) for x in (records / "data.jsonl").read_text().splitlines()],
                     table_rows(tmp_path / "R.md")))
        time.sleep(1.1)  # the date has seconds
    (first, first_rows), (second, second_rows) = runs
    key = lambda r: (r["section"], r["figure"], r["column"])  # noqa: E731
    assert len(first) == len(second) == 5 and sorted(map(key, first)) == sorted(map(key, second))
    assert all(a["date"] < b["date"] for a, b in zip(sorted(first, key=key), sorted(second, key=key)))
    assert len(first_rows) == len(second_rows) == 5
    assert {r["command"] for r in second} == {"python -m benchmarks " + " ".join(argv)}
    assert exit_code(["report", "--check", "--records", str(records), "--output", str(tmp_path / "R.md")], capsys)[0] == 0
