"""precision: auto: the faster of fp32 and bf16 by timing the job's own work, with the timer
replaced (the choice each way, the tie rule, the cache, a corrupt cache, resume keeping the
choice, the budget counting the timing), and the cost of timing the preset's model on this CPU."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch

from attnmt import autoprecision, precision, rundir
from attnmt.autoprecision import Choice
from attnmt.config import config_from_dict, load_config
from attnmt.data.batching import make_batch
from attnmt.decode.native import NativeEngine
from attnmt.model.transformer import Transformer
from attnmt.train import calibration
from attnmt.train.loop import TrainingRun
from tests.conftest import copy_task_config, tiny_model

MINUTES_56 = 56 * 60.0
REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    """Seconds that move only when a fake step says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_step(rates: dict[str, float], clock: FakeClock, calls: list | None = None, tokens: int = 1000):
    """A step of ``tokens`` tokens that takes tokens / rates[precision] fake seconds."""
    def step(p: str, i: int) -> int:
        if calls is not None:
            calls.append((p, i))
        clock.now += tokens / rates[p]
        return tokens
    return step


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """The user's cache directory in tmp_path, and a CPU with bfloat16 kernels (so that auto times)."""
    monkeypatch.delenv("ATTNMT_PRECISION_CACHE", raising=False)  # the session's (conftest): this test's own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "cpu_bf16_is_fast", lambda: True)
    return tmp_path / "cache" / "attnmt" / autoprecision.CACHE_NAME


@pytest.fixture
def fake_timer(monkeypatch):
    """Replace the timer of ``autoprecision.measure``: the real steps run (the model's passes), and
    each advances a fake clock by tokens / the rate the test sets in ``state['rates']``; the
    measurements are counted in ``state['measured']``."""
    state = {"rates": {"fp32": 1000.0, "bf16": 2000.0}, "measured": 0}
    real = autoprecision.measure

    def measure(step, count, **kw):
        clock = FakeClock()
        state["measured"] += 1

        def timed(p, i):
            tokens = step(p, i)
            clock.now += tokens / state["rates"][p]
            return tokens
        return real(timed, count, clock=clock)
    monkeypatch.setattr(autoprecision, "measure", measure)
    return state


# ---- the rule and the timing --------------------------------------------------------------------

def test_the_faster_wins_each_way_and_ties_go_to_fp32():
    assert autoprecision.decide({"fp32": 3520, "bf16": 2150}) == "fp32"
    assert autoprecision.decide({"fp32": 2150, "bf16": 3520}) == "bf16"
    assert autoprecision.decide({"fp32": 3000, "bf16": 3000}) == "fp32"  # a tie
    assert autoprecision.decide({"fp32": 3000, "bf16": 3000 * 1.04}) == "fp32"  # within the margin
    assert autoprecision.decide({"fp32": 3000, "bf16": 3000 * 1.06}) == "bf16"  # beyond it
    assert autoprecision.decide({"fp32": 3000}) == "fp32"


def test_measure_alternates_the_precisions_and_gives_each_rate():
    clock, calls = FakeClock(), []
    rates = autoprecision.measure(fake_step({"fp32": 3520.0, "bf16": 2150.0}, clock, calls), 5, clock=clock)
    assert rates == pytest.approx({"fp32": 3520.0, "bf16": 2150.0})
    assert calls[:2] == [("fp32", 0), ("bf16", 0)]  # the warm-up, untimed
    timed = calls[2:]
    assert timed[:4] == [("fp32", 1), ("bf16", 1), ("bf16", 2), ("fp32", 2)]  # ABBA
    assert len(timed) == 8 and {i for _, i in timed} == {1, 2, 3, 4}  # each batch once: enough
    line = Choice(autoprecision.decide(rates), {"fp32": 3520.0, "bf16": 2150.0}).line()
    assert line == "precision auto: fp32 3,520 tok/s, bf16 2,150 tok/s -> fp32"


def test_measure_stops_at_its_time_cap_after_the_minimum():
    clock, calls = FakeClock(), []
    # each timed step takes 10 s: the minimum of two rounds, then the cap (12 s) is passed
    autoprecision.measure(fake_step({"fp32": 100.0, "bf16": 100.0}, clock, calls), 50, clock=clock)
    assert len(calls) == 2 + 2 * autoprecision.MIN_TIMED


# ---- the cache ----------------------------------------------------------------------------------

def counted_step(calls: list):
    """A step of 1,000 tokens that does nothing but count its calls."""
    def step(p: str, i: int) -> int:
        calls.append((p, i))
        return 1000
    return step


def test_the_cache_keeps_a_choice_per_cpu_model_and_job_shape(cache_home, fake_timer, caplog):
    calls = []
    fake_timer["rates"] = {"fp32": 1000.0, "bf16": 3000.0}
    with caplog.at_level(logging.INFO, logger="attnmt.autoprecision"):
        first = autoprecision.choose("train", "shape A", counted_step(calls), 3)
    assert first.precision == "bf16" and first.how == "measured" and calls
    assert autoprecision.cache_file() == cache_home
    assert "precision auto: fp32 1,000 tok/s, bf16 3,000 tok/s -> bf16" in caplog.text
    entries = json.loads(cache_home.read_text())["entries"]
    [key] = entries
    assert autoprecision.cpu_identity() in key and "shape A" in key and entries[key]["precision"] == "bf16"
    calls.clear()
    fake_timer["rates"] = {"fp32": 3000.0, "bf16": 1000.0}
    with caplog.at_level(logging.INFO, logger="attnmt.autoprecision"):
        again = autoprecision.choose("train", "shape A", counted_step(calls), 3)
    assert (again.precision, again.how, calls) == ("bf16", "cache", [])  # nothing timed again
    assert "fp32 1,000 tok/s, bf16 3,000 tok/s -> bf16 (timed before on this CPU model" in caplog.text
    other = autoprecision.choose("train", "shape B", counted_step(calls), 3)
    assert other.precision == "fp32" and calls  # another shape: timed
    assert len(json.loads(cache_home.read_text())["entries"]) == 2


@pytest.mark.parametrize("content", ["{not json", '{"layout": 99, "entries": {}}', "[1, 2]",
                                     '{"layout": 1, "entries": {"k": {"precision": "int8", "rates": {}}}}'])
def test_a_corrupt_cache_is_ignored_with_a_warning_and_written_anew(cache_home, fake_timer, caplog, content):
    cache_home.parent.mkdir(parents=True)
    cache_home.write_text(content)
    fake_timer["rates"] = {"fp32": 3000.0, "bf16": 1000.0}
    with caplog.at_level(logging.WARNING, logger="attnmt.autoprecision"):
        choice = autoprecision.choose("train", "shape", counted_step([]), 3)
    assert choice.precision == "fp32" and choice.how == "measured"
    assert "not a readable precision cache" in caplog.text and str(cache_home) in caplog.text
    assert json.loads(cache_home.read_text())["layout"] == autoprecision.CACHE_LAYOUT  # a good file again


def test_a_cpu_without_bfloat16_kernels_times_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNMT_PRECISION_CACHE", str(tmp_path / "attnmt" / "precision.json"))
    monkeypatch.setattr(precision, "cpu_bf16_is_fast", lambda: False)
    calls = []
    choice = autoprecision.choose("train", "shape", counted_step(calls), 3)
    assert (choice.precision, calls, choice.seconds) == ("fp32", [], 0.0)
    assert not (tmp_path / "attnmt").exists()


# ---- training -----------------------------------------------------------------------------------

def test_training_auto_picks_the_faster_each_way_caches_it_and_a_resume_keeps_it(tmp_path, cache_home, fake_timer,
                                                                                   caplog):
    raw = copy_task_config(tmp_path, max_steps=2, precision="auto", valid_every=2, average_last=0)
    with caplog.at_level(logging.INFO):
        run = TrainingRun(config_from_dict(raw), tmp_path / "a", progress=False)
    assert run.trainer.precision == "bf16" and fake_timer["measured"] == 1
    assert "precision auto: fp32 1,000 tok/s, bf16 2,000 tok/s -> bf16" in caplog.text
    model_line = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model:")][-1]
    assert model_line.endswith("precision bf16") and "auto" not in model_line
    run.run()
    kept = json.loads((tmp_path / "a" / rundir.PRECISION_CHOICE).read_text())
    assert kept["precision"] == "bf16" and kept["rates"] == {"fp32": 1000.0, "bf16": 2000.0}
    records = [json.loads(line) for line in (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()]
    assert [r["precision"] for r in records if r["kind"] == "done"] == ["bf16"]

    # a second run of the same shape on this CPU model: the cache, nothing timed
    fake_timer["rates"] = {"fp32": 2000.0, "bf16": 1000.0}
    assert TrainingRun(config_from_dict(raw), tmp_path / "b", progress=False).trainer.precision == "bf16"
    assert fake_timer["measured"] == 1

    # without the cache the other way round: fp32
    cache_home.unlink()
    assert TrainingRun(config_from_dict(raw), tmp_path / "c", progress=False).trainer.precision == "fp32"
    assert fake_timer["measured"] == 2

    # a resumed run keeps its own choice, whatever this CPU (or the cache) would pick now
    cache_home.unlink()
    raw["train"]["max_steps"] = 4
    caplog.clear()
    with caplog.at_level(logging.INFO):
        resumed = TrainingRun(config_from_dict(raw), tmp_path / "a", resume=True, progress=False)
    assert resumed.trainer.precision == "bf16" and fake_timer["measured"] == 2
    assert "-> bf16 (the run's own choice)" in caplog.text
    assert not cache_home.exists()

    # a tie goes to fp32; an explicit precision times nothing
    fake_timer["rates"] = {"fp32": 1000.0, "bf16": 1000.0}
    assert TrainingRun(config_from_dict(raw), tmp_path / "d", progress=False).trainer.precision == "fp32"
    raw["train"]["precision"] = "bf16"
    assert TrainingRun(config_from_dict(raw), tmp_path / "e", progress=False).trainer.precision == "bf16"
    assert fake_timer["measured"] == 3 and not (tmp_path / "e" / rundir.PRECISION_CHOICE).exists()


def test_the_timing_changes_nothing_of_the_run_and_counts_in_its_budget(tmp_path, cache_home, monkeypatch):
    raw = copy_task_config(tmp_path, max_steps=2, precision="fp32")
    plain = TrainingRun(config_from_dict(raw), tmp_path / "plain", progress=False)
    plain_rng = torch.random.get_rng_state()
    raw["train"]["precision"] = "auto"
    real = autoprecision.measure

    def slow_measure(step, count, **kw):  # real timing, one second longer
        time.sleep(1.0)
        return {**real(step, count, **kw), "fp32": 1e9}
    monkeypatch.setattr(autoprecision, "measure", slow_measure)
    auto = TrainingRun(config_from_dict(raw), tmp_path / "auto", progress=False)
    assert auto.trainer.precision == "fp32"
    assert torch.equal(torch.random.get_rng_state(), plain_rng)
    for (name, a), b in zip(auto.trainer.model.state_dict().items(), plain.trainer.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert all(p.grad is None for p in auto.trainer.model.parameters())
    # the time budget (max_minutes, the time_budget schedule) runs from before the timing
    assert auto.trainer.elapsed() >= 1.0


def test_timing_the_preset_s_model_costs_under_1_percent_of_its_56_minute_budget(tmp_path, monkeypatch):
    """On the CPU at hand, the real timing of the multi30k_de_en preset's model (d_model 256, 3+3
    layers, 8k vocabulary) on batches of its batch size (4,096 tokens). Its cost is taken as the
    process's CPU seconds per thread (the work it does, which a shared machine's other processes do
    not inflate as they inflate the wall clock) and must stay under 1% of 56 minutes."""
    monkeypatch.setenv("ATTNMT_PRECISION_CACHE", str(tmp_path / "precision.json"))
    config = load_config(REPO / "configs" / "multi30k_de_en.yaml")
    torch.manual_seed(0)
    model = Transformer(config.model, 8000, 8000)
    generator = torch.Generator().manual_seed(0)
    length = 17  # Multi30k's sentences are about this many pieces long
    per_batch = config.train.batch_tokens // (length + 1)

    def sentences():
        return [torch.randint(4, 8000, (length,), generator=generator).tolist() for _ in range(per_batch)]
    batches = [make_batch(sentences(), sentences()) for _ in range(calibration.BATCHES)]
    wall, cpu = time.perf_counter(), time.process_time()
    choice = calibration.calibrate(model, batches, config, torch.device("cpu"))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    cost = cpu / torch.get_num_threads()
    assert cost < 0.01 * MINUTES_56, f"{cost:.1f} CPU s per thread ({wall:.1f} s wall): {choice.line()}"
    if precision.cpu_bf16_is_fast():
        assert choice.how == "measured" and set(choice.rates) == {"fp32", "bf16"}
        assert choice.precision == autoprecision.decide(choice.rates)
    else:
        assert (choice.precision, choice.seconds) == ("fp32", 0.0)


# ---- translation --------------------------------------------------------------------------------

def test_translation_auto_picks_the_faster_names_it_and_caches_it(cache_home, fake_timer):
    model = tiny_model(vocab=30)
    engine = NativeEngine(model, "cpu", "auto")
    assert engine.precision == "bf16" and next(engine.model.parameters()).dtype == torch.bfloat16
    assert fake_timer["measured"] == 1
    fake_timer["rates"] = {"fp32": 2000.0, "bf16": 1000.0}
    assert NativeEngine(tiny_model(vocab=30), "cpu", "auto").precision == "bf16"  # cached
    cache_home.unlink()
    engine = NativeEngine(tiny_model(vocab=30), "cpu", "auto")
    assert engine.precision == "fp32" and next(engine.model.parameters()).dtype == torch.float32
    assert fake_timer["measured"] == 2
    assert NativeEngine(tiny_model(vocab=30), "cpu", "fp32").precision == "fp32" and fake_timer["measured"] == 2
    with pytest.raises(ValueError, match="int8"):
        NativeEngine(tiny_model(vocab=30), "cpu", "int8").set_precision("auto")


def test_a_model_directory_s_auto_is_timed_and_an_explicit_precision_is_not(tiny_run, tmp_path, cache_home,
                                                                             fake_timer):
    import shutil

    from attnmt.interop.engines import open_translator

    model_dir = tmp_path / "model"
    shutil.copytree(tiny_run, model_dir)
    config = rundir.read_config(model_dir)
    rundir.write_config(config.model_copy(update={"decode": config.decode.model_copy(update={"precision": "auto"})}),
                        model_dir)
    assert open_translator(model_dir, precision="fp32").precision == "fp32"
    assert fake_timer["measured"] == 0  # --precision fp32 over the model's auto: nothing timed
    tr = open_translator(model_dir)
    assert tr.precision == "bf16" and fake_timer["measured"] == 1


def test_off_the_cpu_auto_keeps_the_device_s_rule_without_timing(tmp_path, monkeypatch, fake_timer):
    from attnmt.train import distributed

    config = config_from_dict(copy_task_config(tmp_path, precision="auto"))
    ranks = distributed.from_env()
    for supported, expected in ((True, "bf16"), (False, "fp16")):  # fp16: a GPU before Ampere
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, supported=supported, **k: supported)
        choice = calibration.training_choice(config, tmp_path, False, None, None, ranks, torch.device("cuda"))
        assert choice.precision == expected and choice.how == "the cuda rule"
    assert calibration.training_choice(config, tmp_path, False, None, None, ranks, torch.device("mps")).precision \
        == "fp32"
    assert fake_timer["measured"] == 0
