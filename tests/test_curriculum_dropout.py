"""Curriculum dropout (train.dropout_curriculum): the rates grow with the update count, the first
update has none, and the run resumes bit-exactly (its refusal with train.compile is in
test_config_rules.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnmt.config import config_from_dict
from attnmt.train.schedules import curriculum_dropout
from attnmt.train.loop import TrainingRun
from tests.test_end_to_end import _config, straight_and_resumed

RATES = {"dropout": 0.3, "attention_dropout": 0.1, "activation_dropout": 0.2}


def _raw(tmp_path, max_steps: int, curriculum: int) -> dict:
    raw = _config(tmp_path, max_steps=max_steps)
    raw["model"].update(RATES)
    raw["train"].update(precision="fp32", batch_tokens=600, valid_bleu=False, log_every=5,
                        dropout_curriculum=curriculum)
    return raw


def test_the_share_grows_from_zero_to_one():
    shares = [curriculum_dropout(step, 200) for step in (0, 100, 200, 600, 5000)]
    assert shares[0] == 0.0 and shares == sorted(shares)
    assert shares[2] == pytest.approx(1 - math.exp(-1)) and shares[3] == pytest.approx(1 - math.exp(-3))
    assert shares[-1] == pytest.approx(1.0, abs=1e-9)


def test_every_rate_follows_the_update_count(tmp_path):
    training = TrainingRun(config_from_dict(_raw(tmp_path, 12, curriculum=10)), tmp_path / "run", progress=False)
    training.run()
    share = curriculum_dropout(11, 10)  # the rates of the last update, made after 11 updates
    sites = {"p": [], "dropout": [], "activation_dropout": []}
    for m in training.trainer.model.modules():
        for name, rates in sites.items():
            if isinstance(getattr(m, name, None), float):
                rates.append(getattr(m, name))
    for name, key in (("p", "dropout"), ("dropout", "attention_dropout"), ("activation_dropout", "activation_dropout")):
        assert sites[name] == [pytest.approx(RATES[key] * share)] * len(sites[name]), name
    # every site is there: embeddings (2) and sub-layers (2 encoder layers x 2, 2 decoder layers x 3);
    # self- and cross-attention (2 x 1 + 2 x 2); feed-forwards (4)
    assert (len(sites["p"]), len(sites["dropout"]), len(sites["activation_dropout"])) == (12, 6, 4)
    logged = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    shares = {r["step"]: r["dropout_share"] for r in logged if r["kind"] == "train"}
    assert shares == {5: round(curriculum_dropout(5, 10), 4), 10: round(curriculum_dropout(10, 10), 4)}


def test_the_first_update_has_no_dropout(tmp_path):
    """After one update, the run equals one whose rates are all 0 (the share at step 0 is 0);
    after five it does not (dropout has begun)."""
    def weights(raw, name):
        TrainingRun(config_from_dict(raw), tmp_path / name, progress=False).run()
        return torch.load(tmp_path / name / "checkpoints" / "last.pt", weights_only=True)["model"]

    curriculum = weights(_raw(tmp_path, 1, curriculum=10), "curriculum")
    none = _raw(tmp_path, 1, curriculum=0)
    none["model"].update({k: 0.0 for k in RATES})
    plain = weights(none, "none")
    assert all(torch.equal(v, plain[k]) for k, v in curriculum.items())
    curriculum5 = weights(_raw(tmp_path, 5, curriculum=10), "curriculum5")
    none["train"]["max_steps"] = 5
    plain5 = weights(none, "none5")
    assert any(not torch.equal(v, plain5[k]) for k, v in curriculum5.items())


def test_a_run_with_curriculum_dropout_resumes_bit_exactly(tmp_path):
    a, b = straight_and_resumed(_raw(tmp_path, 30, curriculum=20), tmp_path, 15)
    assert a["progress"]["step"] == b["progress"]["step"] == 30
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    c, _ = straight_and_resumed(_raw(tmp_path, 30, curriculum=0), tmp_path / "constant", 15)
    assert any(not torch.equal(value, c["model"][key]) for key, value in a["model"].items())

