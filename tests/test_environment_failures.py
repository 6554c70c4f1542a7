"""A failure of the environment (attnmt.errors.EnvironmentFailure) reaches the user as one line on
stderr with exit status 1, and leaves nothing half-written: a worker process killed, a C++ compiler
that does not work under train.compile, an engine library that raises, memory exhausted, a full
disk. Every boundary where attnmt hands work to a library (each ``library_call`` in src/attnmt, read
from the code) has a case here that makes the library raise its own exception type."""

from __future__ import annotations

import ast
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from attnmt import cli
from tests.conftest import skip_without
from tests.conftest import REPO, copy_task_config
from tests.test_hardening import assert_one_line_error, run_cli

SRC = REPO / "src" / "attnmt"


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones too) with its content: what a failed command must leave as it was."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_environment_failure(rc: int, err: str, *needles: str) -> None:
    """One line, exit status 1, no traceback, naming each of ``needles``."""
    assert_one_line_error(rc, err, *needles, status=1)


# ---- the boundaries, read from the code ---------------------------------------------------------


def library_boundaries() -> set[str]:
    """The ``what`` of every ``library_call(what, ...)`` in src/attnmt (an f-string's literal start)."""
    found = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "library_call" and node.args:
                first = node.args[0]
                if isinstance(first, ast.JoinedStr):  # f"CTranslate2 ({call})": its text up to the first field
                    literal = []
                    for part in first.values:
                        if not isinstance(part, ast.Constant):
                            break
                        literal.append(part.value)
                    found.add("".join(literal))
                else:
                    found.add(first.value)
    return found


@pytest.fixture(scope="module")
def ct2_dir(tiny_run, tmp_path_factory) -> Path:
    from attnmt.interop.ctranslate2 import export_ctranslate2

    return export_ctranslate2(tiny_run, tmp_path_factory.mktemp("ct2") / "export")


@pytest.fixture(scope="module")
def onnx_dir(tiny_run, tmp_path_factory) -> Path:
    from attnmt.interop.onnx import export_onnx

    return export_onnx(tiny_run, tmp_path_factory.mktemp("onnx") / "export")


def _translate_into_file(capsys, model: Path, tmp_path: Path, *options: str) -> tuple[int, str]:
    """``attnmt translate`` of one line into an existing output file, which a failure must keep."""
    (tmp_path / "in").write_text("alpha bravo\ncharlie\n")
    (tmp_path / "out").write_text("previous\n")
    rc, _, err = run_cli(capsys, "translate", "--model", str(model), "--input", str(tmp_path / "in"), "--output",
                         str(tmp_path / "out"), *options)
    assert (tmp_path / "out").read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]  # no temporary file left
    return rc, err


def _failing_ctranslate2(monkeypatch, method: str, message: str) -> None:
    """CTranslate2's Translator, whose ``method`` raises the library's RuntimeError with ``message``;
    every other attribute is the real translator's."""
    from attnmt.interop import ctranslate2_engine

    real = ctranslate2_engine.ctranslate2.Translator

    def fail(*args, **kwargs):
        raise RuntimeError(message)

    class Failing:
        def __init__(self, *args, **kwargs):
            self._real = real(*args, **kwargs)

        def __getattr__(self, name):
            return fail if name == method else getattr(self._real, name)

    monkeypatch.setattr(ctranslate2_engine.ctranslate2, "Translator", Failing)


def case_ctranslate2_translate(request, tmp_path, monkeypatch, capsys) -> None:
    """CTranslate2's translator raises its RuntimeError (a failed allocation) while translating."""
    export = request.getfixturevalue("ct2_dir")
    _failing_ctranslate2(monkeypatch, "translate_batch", "std::bad_alloc\nmore lines of the library")
    rc, err = _translate_into_file(capsys, export, tmp_path, "--engine", "ctranslate2", "--early-stopping", "true")
    assert_environment_failure(rc, err, "CTranslate2 (translate_batch) failed: std::bad_alloc", "--engine native")


def case_ctranslate2_score(request, tmp_path, monkeypatch, capsys) -> None:
    """CTranslate2's forced decoding (score_batch, behind --scores) raises."""
    export = request.getfixturevalue("ct2_dir")
    _failing_ctranslate2(monkeypatch, "score_batch", "CUDA failed with error out of memory")
    rc, err = _translate_into_file(capsys, export, tmp_path, "--engine", "ctranslate2", "--early-stopping", "true",
                                   "--scores", "--beam-size", "1")
    assert_environment_failure(rc, err, "CTranslate2 (score_batch) failed: CUDA failed")


def case_onnxruntime_run(request, tmp_path, monkeypatch, capsys) -> None:
    """ONNX Runtime raises its own Fail while running a graph."""
    import onnxruntime

    export = request.getfixturevalue("onnx_dir")
    fail = onnxruntime.capi.onnxruntime_pybind11_state.Fail

    def run(self, *args, **kwargs):
        raise fail("[ONNXRuntimeError] : 1 : FAIL : bad allocation")

    monkeypatch.setattr(onnxruntime.InferenceSession, "run", run)
    rc, err = _translate_into_file(capsys, export, tmp_path, "--engine", "onnxruntime")
    assert_environment_failure(rc, err, "ONNX Runtime (running the exported graphs) failed", "bad allocation")


def case_onnx_export(request, tmp_path, monkeypatch, capsys) -> None:
    """torch.onnx.export raises its OnnxExporterError: no export directory is left behind."""
    import torch

    model = request.getfixturevalue("tiny_run")

    def export(*args, **kwargs):
        raise torch.onnx.errors.OnnxExporterError("Unsupported: ONNX export of operator foo")

    monkeypatch.setattr(torch.onnx, "export", export)
    rc, _, err = run_cli(capsys, "export", "onnx", "--model", str(model), "--output", str(tmp_path / "export"))
    assert_environment_failure(rc, err, "the ONNX export", "ONNX export of operator foo")
    assert list(tmp_path.iterdir()) == []


def case_ctranslate2_convert(request, tmp_path, monkeypatch, capsys) -> None:
    """CTranslate2's converter raises: no export directory is left behind."""
    import ctranslate2

    model = request.getfixturevalue("tiny_run")

    def convert(self, *args, **kwargs):
        raise RuntimeError("failed to write model.bin")

    monkeypatch.setattr(ctranslate2.converters.Converter, "convert", convert)
    rc, _, err = run_cli(capsys, "export", "ctranslate2", "--model", str(model), "--output", str(tmp_path / "export"))
    assert_environment_failure(rc, err, "the CTranslate2 converter failed: failed to write model.bin")
    assert list(tmp_path.iterdir()) == []


def case_quantizer(request, tmp_path, monkeypatch, capsys) -> None:
    """ONNX Runtime's int8 quantizer raises while the web page is written: no site is left behind."""
    import onnxruntime.quantization

    skip_without("page")
    model = request.getfixturevalue("tiny_run")

    def quantize_dynamic(*args, **kwargs):
        raise ValueError("Unsupported model IR version")

    monkeypatch.setattr(onnxruntime.quantization, "quantize_dynamic", quantize_dynamic)
    rc, _, err = run_cli(capsys, "export", "web", "--model", str(model), "--output", str(tmp_path / "site"),
                         "--quantization", "int8")
    assert_environment_failure(rc, err, "int8 quantizer (quantize_dynamic) failed", "--quantization float32")
    assert list(tmp_path.iterdir()) == []


def case_gensim(request, tmp_path, monkeypatch, capsys) -> None:
    """gensim's FastText raises while it trains vectors: the .vec file is not written."""
    pytest.importorskip("gensim")
    from gensim.models import FastText

    def train(self, *args, **kwargs):
        raise RuntimeError("you must first build vocabulary before training the model")

    monkeypatch.setattr(FastText, "train", train)
    data = tmp_path / "data"
    data.mkdir()
    raw = copy_task_config(data)
    raw["data"]["pair"] = "de-en"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    rc, _, err = run_cli(capsys, "train-vectors", str(tmp_path / "c.yaml"), "--side", "src", "--output",
                         str(tmp_path / "src.vec"), "--dim", "8", "--epochs", "1")
    assert_environment_failure(rc, err, "gensim's FastText training failed", "build vocabulary")
    assert not (tmp_path / "src.vec").exists()


def case_torch_compile(request, tmp_path, monkeypatch, capsys) -> None:
    """A C++ compiler that answers --version but fails to compile, under train.compile: the first
    compiled step fails; one line, exit 1 (a fresh process, so that no compiled kernel is cached)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ to answer --version")
    fake = _fake_compilers(tmp_path / "bin", f'if [ "$1" = "--version" ]; then exec {gxx} --version; fi\n'
                                             'echo "cc1plus: internal compiler error" >&2\nexit 1\n')
    rc, err = _train_compiled(tmp_path, fake)
    assert_environment_failure(rc, err, "train.compile: torch.compile failed", "--set train.compile=false")


def case_distributed_rendezvous(request, tmp_path, monkeypatch, capsys) -> None:
    """torch.distributed cannot join the process group (a rank that never came): nothing is written."""
    import torch.distributed

    def init_process_group(*args, **kwargs):
        raise torch.distributed.DistNetworkError("The client socket has timed out after 1800000ms while trying to "
                                                 "connect to (127.0.0.1, 29500)")

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    # the first step of joining is the rendezvous of attnmt.train.rounds (its store): it times out the same way
    monkeypatch.setattr(torch.distributed, "rendezvous", init_process_group)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    (tmp_path / "data").mkdir()
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(copy_task_config(tmp_path / "data")))
    before = tree(tmp_path)
    rc, _, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "run"))
    assert_environment_failure(rc, err, "torch.distributed (joining the process group) failed", "timed out",
                               "MASTER_ADDR")
    assert tree(tmp_path) == before


CASES = {
    "CTranslate2 (": [case_ctranslate2_translate, case_ctranslate2_score],
    "ONNX Runtime (running the exported graphs)": [case_onnxruntime_run],
    "the ONNX export (torch.onnx.export, onnx.checker)": [case_onnx_export],
    "the CTranslate2 converter": [case_ctranslate2_convert],
    "ONNX Runtime's int8 quantizer (quantize_dynamic)": [case_quantizer],
    "gensim's FastText training": [case_gensim],
    "train.compile: torch.compile": [case_torch_compile],
    "torch.distributed (joining the process group)": [case_distributed_rendezvous],
}


def test_every_library_boundary_in_the_code_has_a_case():
    """A new ``library_call`` in src/attnmt needs its case in CASES (the parametrized test below)."""
    found = library_boundaries()
    assert len(found) >= 8 and found == set(CASES), found ^ set(CASES)


@pytest.mark.parametrize("case", [c for cases in CASES.values() for c in cases], ids=lambda c: c.__name__[5:])
def test_a_library_that_raises_is_one_line_and_exit_status_1(case, request, tmp_path, monkeypatch, capsys):
    case(request, tmp_path, monkeypatch, capsys)


# ---- a broken compiler --------------------------------------------------------------------------


def _fake_compilers(directory: Path, script: str) -> Path:
    directory.mkdir()
    for name in ("g++", "c++", "clang++", "gcc", "cc"):
        (directory / name).write_text("#!/bin/sh\n" + script)
        (directory / name).chmod(0o755)
    return directory


def _train_compiled(tmp_path: Path, compilers: Path) -> tuple[int, str]:
    """``attnmt train`` with train.compile on, the fake compilers first on PATH, in a fresh process."""
    data = tmp_path / "data"
    data.mkdir()
    raw = copy_task_config(data, max_steps=2, compile=True, valid_every=10, valid_bleu=False, average_last=0)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    env = {**os.environ, "PATH": f"{compilers}:{os.environ['PATH']}",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    env.pop("CXX", None)
    run = subprocess.run([sys.executable, "-m", "attnmt", "-q", "train", str(tmp_path / "c.yaml"), "--output",
                          str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=600)
    return run.returncode, run.stderr


def test_a_cpp_compiler_that_does_not_run_stops_training_before_anything_is_written(tmp_path):
    fake = _fake_compilers(tmp_path / "bin", 'echo "g++: error while loading shared libraries" >&2\nexit 1\n')
    rc, err = _train_compiled(tmp_path, fake)
    assert_environment_failure(rc, err, f"the C++ compiler {fake}/g++ does not work", "exits with status 1",
                               "error while loading shared libraries", "--set train.compile=false")
    assert not (tmp_path / "run").exists()


# ---- a killed worker ----------------------------------------------------------------------------


def test_a_prepare_worker_killed_while_it_works_is_one_line_and_leaves_no_output(tmp_path, capsys):
    """``attnmt prepare --workers 2``, each worker reading one side of the corpus: the sides are
    FIFOs that this test keeps open and silent, so the workers are at work (blocked reading) until
    one is killed with SIGKILL, found among this process's children."""
    psutil = pytest.importorskip("psutil")
    raw = copy_task_config(tmp_path)
    for side in ("src", "tgt"):
        fifo = tmp_path / f"fifo.{side}"
        os.mkfifo(fifo)
        raw["data"][f"train_{side}"] = str(fifo)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    writers = []

    def hold_open(path):  # a writer that never writes: a reader blocks until it is closed
        writers.append(open(path, "wb"))

    for side in ("src", "tgt"):
        threading.Thread(target=hold_open, args=(tmp_path / f"fifo.{side}",), daemon=True).start()
    killed = []
    me = psutil.Process()
    earlier = {child.pid for child in me.children()}  # an earlier test's processes are not workers

    def kill_a_worker():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            workers = [child for child in me.children() if child.pid not in earlier]
            if len(workers) == 2:  # both sides being read
                time.sleep(0.2)
                os.kill(workers[0].pid, signal.SIGKILL)
                killed.append(workers[0].pid)
                return
            time.sleep(0.01)
        for writer in writers:  # no worker found: end the reading, so the command ends and the test fails
            writer.close()

    killer = threading.Thread(target=kill_a_worker, daemon=True)
    killer.start()
    try:
        rc, _, err = run_cli(capsys, "prepare", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "prepared"),
                             "--workers", "2")
    finally:
        for writer in writers:
            writer.close()
    killer.join()
    assert killed, "no worker process appeared"
    assert_environment_failure(rc, err, f"a worker process of attnmt (pid {killed[0]}) ended without answering",
                               "killed by SIGKILL", "run the command again")
    assert not (tmp_path / "prepared").exists()
    assert [child for child in me.children() if child.pid not in earlier] == []  # the other worker is gone too


def test_prepare_on_a_full_disk_is_one_line_and_leaves_no_output(tmp_path, monkeypatch, capsys):
    from attnmt.data.tokenizers import Tokenizer

    def full(self, path):
        Path(path).write_bytes(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Tokenizer, "save", full)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(copy_task_config(tmp_path)))
    before = tree(tmp_path)
    rc, _, err = run_cli(capsys, "prepare", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "prepared"))
    assert_environment_failure(rc, err, "spm.model: cannot write: No space left on device", "free some space")
    assert tree(tmp_path) == before


def test_a_permission_error_stays_the_users_mistake(tmp_path, monkeypatch, capsys):
    """Only the disk's failures are the environment's: a write refused for permission is exit 2."""
    from attnmt.errors import DiskFull, WriteError, write_error

    assert isinstance(write_error("f: cannot write", OSError(errno.ENOSPC, "full")), DiskFull)
    assert isinstance(write_error("f: cannot write", OSError(errno.EDQUOT, "quota")), DiskFull)
    refused = write_error("f: cannot write", OSError(errno.EACCES, "denied"))
    assert isinstance(refused, WriteError) and not isinstance(refused, DiskFull)


# ---- memory -------------------------------------------------------------------------------------


@pytest.mark.parametrize("error", ["MemoryError", "torch.OutOfMemoryError"])
def test_memory_exhausted_is_one_line_and_keeps_the_old_output(error, tiny_run, tmp_path, monkeypatch, capsys):
    import torch

    from attnmt.decode.translator import Translator

    def translate(self, *args, **kwargs):
        if error == "MemoryError":
            raise MemoryError()
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(Translator, "translate", translate)
    rc, err = _translate_into_file(capsys, tiny_run, tmp_path)
    assert_environment_failure(rc, err, "out of memory", "smaller batches")


def test_a_bug_in_attnmt_keeps_its_traceback(tiny_run, tmp_path, monkeypatch):
    """Not every exception is the environment's: one from attnmt's own code is raised as it is."""
    from attnmt.decode.translator import Translator

    def translate(self, *args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(Translator, "translate", translate)
    (tmp_path / "in").write_text("alpha\n")
    with pytest.raises(KeyError):
        cli.main(["-q", "translate", "--model", str(tiny_run), "--input", str(tmp_path / "in"), "--output",
                  str(tmp_path / "out")])


def test_a_sentencepiece_model_that_does_not_parse_is_the_users_file(tmp_path):
    """SentencePiece's own error on a broken file given by the user (an imported model's source.spm) is exit 2's."""
    from attnmt.data.tokenizers import VocabTokenizer
    from attnmt.errors import CheckpointError

    (tmp_path / "source.spm").write_bytes(b"not a model")
    with pytest.raises(CheckpointError, match="source.spm: not a SentencePiece model"):
        VocabTokenizer.load_with_vocab(tmp_path / "source.spm", ["</s>", "<unk>", "<pad>"])
