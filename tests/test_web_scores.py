"""The page's score (``searchScore`` in src/attnmt/web/src/search.js) equals
``SearchOptions.score`` on the same hypotheses, for every length penalty, greedy and beam search:
Python writes the cases, node's test runner checks them (web/test/scores.test.js)."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import numpy as np

from attnmt.search.options import SearchOptions
from tests.conftest import skip_without

WEB = Path(__file__).resolve().parents[1] / "src" / "attnmt" / "web"

# SearchOptions fields: greedy and beam search, both length penalties, a negative alpha and k 0.
SETTINGS = [dict(beam_size=beam, length_penalty_type=kind, length_penalty=alpha, length_penalty_k=k)
            for beam in (1, 4) for kind in ("gnmt", "average") for alpha, k in ((0.6, 5.0), (1.4, 5.0), (-0.5, 0.0))]


def _cases() -> list[dict]:
    """Hypotheses of 1 to 40 tokens whose log P is a float32 sum of token log-probabilities, as
    a search accumulates them, and Python's score of each under every setting."""
    rng = random.Random(3)
    hyps = []
    for _ in range(60):
        length = rng.randint(1, 40)
        lps = np.log(np.asarray([rng.uniform(1e-4, 1.0) for _ in range(length)], dtype=np.float32))
        hyps.append((float(np.cumsum(lps, dtype=np.float32)[-1]), length))
    hyps.append((0.0, 1))
    cases = []
    for fields in SETTINGS:
        options = SearchOptions(**fields)
        page = {"lengthPenaltyType": fields["length_penalty_type"], "beamSize": fields["beam_size"],
                "alpha": fields["length_penalty"], "k": fields["length_penalty_k"]}
        cases += [{"options": page, "logProb": lp, "length": n, "score": options.score(lp, n)}
                  for lp, n in hyps]
    return cases


def test_page_scores_equal_python_scores(tmp_path):
    skip_without("node")
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(_cases()), encoding="utf-8")
    run = subprocess.run(["node", "--test", "test/scores.test.js"], cwd=WEB, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "ATTNMT_SCORE_CASES": str(path)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "# pass 1" in run.stdout and "# skipped 0" in run.stdout
