"""An option that cannot work is refused before any work starts: every option of the commands
that load a model or run on a device, whose name says it names a device, an engine, a precision,
a compute type, an attention kernel, a layer or a quantization (:data:`NAMES_A_CAPABILITY`,
walked from ``build_parser()``, so a new option of that kind fails
:func:`test_every_capability_option_has_a_case` until it has one), is given a value that this
machine or the tiny model cannot honour. The command must end in one line, exit 2, before its
work: the server never starts, nothing is searched, the model's weights are not even loaded
(where the option is one the engine is chosen with), and no output is made."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from attnmt.cli import build_parser
from tests.conftest import copy_task_config
from tests.test_hardening import assert_one_line_error, run_cli
from tests.test_refusals_write_nothing import write_config

# the commands that load a model or run on a device
COMMANDS = ("serve", "translate", "evaluate", "score", "plot-attention", "distill", "train", "export")
NAMES_A_CAPABILITY = re.compile(r"device|engine|precision|compute|attention|layer|quantization|bits")
ABSENT_GPU = "cuda:99"  # no machine of the tests has 100 GPUs; one without CUDA has none

# options of that kind whose every value this machine and every model honour, and why
HONOURED_EVERYWHERE = {
    ("plot-attention", "precision"): "every precision runs on the CPU; int8 elsewhere is refused by check_device "
                                     "(test_int8_on_a_gpu_is_refused_before_loading)",
    ("plot-attention", "attention"): "both kernels run wherever PyTorch runs (native engine only)",
    ("plot-attention", "self_attention"): "every model has an encoder and a decoder",
}

# the options refused by check_load_options or check_device, before the weights are read
BEFORE_LOADING = {"device", "engine", "precision", "compute_type", "attention"}


def _engine_cases(command: str, head: list[str]) -> dict:
    """The cases of the options every translating command shares (``add_engine_options``)."""
    return {
        (command, "device"): (head + ["--device", ABSENT_GPU], [ABSENT_GPU]),
        (command, "engine"): (head + ["--engine", "onnxruntime"], ["encoder.onnx"]),
        (command, "compute_type"): (head + ["--engine", "ctranslate2", "--device", "cpu", "--compute-type", "float16"],
                                    ["--compute-type float16", "cpu"]),
    }


def _native_cases(command: str, head: list[str]) -> dict:
    """Cases of the native engine's loading options under an engine without them."""
    return {
        (command, "precision"): (head + ["--engine", "ctranslate2", "--precision", "bf16"], ["precision"]),
        (command, "attention"): (head + ["--engine", "ctranslate2", "--attention", "fused"], ["attention"]),
    }


def cases(model: str, work: Path) -> dict[tuple[str, str], tuple[list[str], list[str]]]:
    """(command, option dest) -> (argv, the words of the one-line error)."""
    src = work / "src.txt"
    src.write_text("alpha bravo\n")
    config = write_config(work, copy_task_config(work))
    heads = {
        "serve": ["serve", "--model", model],
        "translate": ["translate", "--model", model, "--input", str(src), "--output", str(work / "out.txt")],
        "evaluate": ["evaluate", "--model", model, "--src", str(src), "--ref", str(src), "--hyp-output",
                     str(work / "hyp.txt")],
        "score": ["score", "--model", model, "--src", str(src), "--tgt", str(src), "--output", str(work / "sc.txt")],
        "distill": ["distill", config, "--teacher", model, "--output", str(work / "student")],
    }
    found: dict = {}
    for command, head in heads.items():
        found |= _engine_cases(command, head)
        if command != "distill":
            found |= _native_cases(command, head)
    plot = ["plot-attention", "--model", model, "--input", str(src), "--output", str(work / "plots")]
    found |= {
        ("translate", "alignment_layer"): (heads["translate"] + ["--alignments", "--alignment-layer", "7"],
                                           ["alignment layer", "7"]),
        ("plot-attention", "device"): (plot + ["--device", ABSENT_GPU], [ABSENT_GPU]),
        ("plot-attention", "layer"): (plot + ["--layer", "9"], ["--layer"]),
        ("train", "device"): (["train", config, "--output", str(work / "run"), "--device", ABSENT_GPU], [ABSENT_GPU]),
        ("export", "quantization"): (["export", "web", "--model", model, "--output", str(work / "web"),
                                      "--quantization", "float16"], ["--quantization", "int8 or float32"]),
        ("export", "int8_weight_bits"): (["export", "onnx", "--model", model, "--output", str(work / "onnx"),
                                          "--int8-weight-bits", "8"], ["--int8-weight-bits", "ctranslate2"]),
    }
    return found


def capability_options() -> set[tuple[str, str]]:
    """(command, dest) of every option of :data:`COMMANDS` that :data:`NAMES_A_CAPABILITY` matches."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {(command, action.dest) for command in COMMANDS for action in sub.choices[command]._actions
            if action.option_strings and NAMES_A_CAPABILITY.search(action.dest)}


def test_every_capability_option_has_a_case(tmp_path):
    options = capability_options()
    assert len(options) >= 25  # the walk finds the options it is meant to (device, engine, ... of each command)
    assert set(cases(str(tmp_path), tmp_path)) | set(HONOURED_EVERYWHERE) == options


@pytest.fixture
def no_work(monkeypatch):
    """Starting the server, searching, scoring, or (``loading=True``) reading the weights fails the test."""
    import uvicorn

    from attnmt import rundir
    from attnmt.decode.translator import Translator

    def work(*args, **kwargs):
        raise AssertionError("the command started its work before refusing the option")

    monkeypatch.setattr(uvicorn, "run", work)
    monkeypatch.setattr(Translator, "_search", work)
    monkeypatch.setattr(Translator, "score", work)
    return lambda: monkeypatch.setattr(rundir, "load_weights", work)


@pytest.mark.parametrize("case", sorted(capability_options() - set(HONOURED_EVERYWHERE)), ids="{0[0]}-{0[1]}".format)
def test_an_option_the_machine_or_model_cannot_honour_is_refused_before_work(case, tiny_run, no_work, tmp_path,
                                                                              capsys):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("fastapi")
    work = tmp_path / "work"
    work.mkdir()
    argv, needles = cases(str(tiny_run), work)[case]
    if case[1] in BEFORE_LOADING:
        no_work()
    before = set(work.iterdir())
    rc, _, err = run_cli(capsys, *argv)
    assert_one_line_error(rc, err, *needles)
    assert set(work.iterdir()) == before  # no output, no folder


def test_the_students_device_is_refused_before_the_teacher_translates(tiny_run, no_work, tmp_path, capsys):
    config = write_config(tmp_path, copy_task_config(tmp_path))
    no_work()
    rc, _, err = run_cli(capsys, "distill", config, "--teacher", str(tiny_run), "--output", str(tmp_path / "student"),
                         "--set", f"train.device={ABSENT_GPU}")
    assert_one_line_error(rc, err, ABSENT_GPU)
    assert not (tmp_path / "student").exists()


def test_int8_on_a_gpu_is_refused_before_loading(tiny_run, monkeypatch):
    """A machine with a GPU: int8 (dynamic quantisation) runs on the CPU only, refused by the
    check a server makes before it starts, not by the first request."""
    import torch

    from attnmt.errors import OptionError
    from attnmt.interop import engines

    monkeypatch.setattr("attnmt.device.resolve_device", lambda name, local_rank=None: torch.device("cuda", 0))
    with pytest.raises(OptionError, match="int8.*CPU only"):
        engines.check_device(tiny_run, "native", "cuda", precision="int8")
    assert engines.check_device(tiny_run, "native", "cuda", precision="bf16") == "cuda:0"
