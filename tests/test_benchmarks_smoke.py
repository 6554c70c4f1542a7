"""Every part of every benchmark suite of the registry (``SUITES`` in ``benchmarks/__main__.py``) at its
``--smoke`` size, so that none can stop working unnoticed; and RESULTS.md as ``python -m benchmarks
report`` builds it from the records.

The smoke runs need Multi30k (``ATTNMT_DATA``); they print their records instead of storing them.
The peers (JoeyNMT, OpenNMT-py) are left out of ``train --part peers`` where the environments of
``benchmarks/setup_peers.sh`` are absent; ``serve --driver wrk`` needs wrk, ``web`` Chromium and the
built page.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_without

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.__main__ import SUITES  # noqa: E402
from benchmarks.records import Record  # noqa: E402

DATA = os.environ.get("ATTNMT_DATA")
RUNS = [(suite, *argv) for suite, module in SUITES.items() for argv in module.PARTS.values()]


# The runs that need the browser features: the web suite opens the page in chromium; the distillation
# part exports the student as a web page (tests/test_web_skips.py checks that every part exporting one is here).
NEEDS = {"web": ("page", "chromium"), "quality --part distill": ("page",)}


def benchmarks(*args: str, work: Path | None = None) -> subprocess.CompletedProcess:
    extra = ["--work", str(work)] if work else []
    return subprocess.run([sys.executable, "-m", "benchmarks", *args, *extra], cwd=REPO, capture_output=True,
                          text=True, timeout=900)


@pytest.fixture(scope="session")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bench")


@pytest.mark.parametrize("argv", RUNS, ids=[" ".join(r[:3]) for r in RUNS])
def test_suite_runs_at_smoke_size(argv, work):
    if not DATA:
        pytest.skip("needs ATTNMT_DATA (the folder holding multi30k/)")
    if "wrk" in argv and shutil.which("wrk") is None:
        pytest.skip("needs wrk")
    skip_without(*NEEDS.get(" ".join(argv[:3]), ()))
    p = benchmarks(argv[0], "--smoke", *argv[1:], work=work)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    records = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert records, p.stdout[-2000:]
    for rec in records:
        assert Record.model_validate(rec).command == "python -m benchmarks " + " ".join([argv[0], "--smoke", *argv[1:],
                                                                                         "--work", str(work)])
    if argv[:3] == ("train", "--part", "peers") and not (REPO / "benchmarks/work/venv-onmt/bin/python").exists():
        assert "benchmarks/setup_peers.sh" in p.stdout + p.stderr


def test_results_md_is_built_from_the_records():
    p = benchmarks("report", "--check")
    assert p.returncode == 0, p.stderr
