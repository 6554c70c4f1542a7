"""A careless user's mistakes with every command end in one line on stderr and exit 2 (or a 4xx
from the server), naming the file, line or field: a closed standard input or output, a model
directory whose config.yaml was edited after training, broken exports, unusable constraints,
and malformed LibreTranslate requests (issue 44)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file

from attnmt import rundir
from attnmt.decode.translator import Translator
from tests.conftest import wait_ready
from tests.test_hardening import assert_one_line_error, run_cli

ATTNMT = [sys.executable, "-m", "attnmt"]


def attnmt_process(*args: str, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, shell: str | None = None
                   ) -> subprocess.CompletedProcess:
    """``attnmt -q ARGS`` as its own process (standard streams as given; ``shell``: a bash
    command line instead, for redirections such as ``0<&-``)."""
    if shell is not None:
        return subprocess.run(["bash", "-c", shell], stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    return subprocess.run([*ATTNMT, "-q", *args], stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, text=True,
                          timeout=120)


def edited_copy(model_dir: Path, root: Path, name: str, **model_keys) -> Path:
    """A copy of ``model_dir`` whose config.yaml sets ``model_keys`` in its model section, as a
    user editing the file by hand would."""
    d = root / name
    shutil.copytree(model_dir, d, ignore=shutil.ignore_patterns("checkpoints", "data"))
    raw = yaml.safe_load((d / "config.yaml").read_text())
    raw["model"].update(model_keys)
    (d / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return d


# ---- standard streams --------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["<&-", "0<&-"])
def test_translate_with_stdin_closed_is_one_line(tiny_run, how):
    result = attnmt_process(shell=f"{' '.join(ATTNMT)} -q translate --model {tiny_run} {how}")
    assert_one_line_error(result.returncode, result.stderr, "standard input is closed", "--input")
    assert result.stdout == ""


def test_translate_with_stdout_closed_is_one_line(tiny_run, tmp_path):
    (tmp_path / "in.txt").write_text("alpha\n")
    result = attnmt_process(shell=f"{' '.join(ATTNMT)} -q translate --model {tiny_run} --input {tmp_path}/in.txt >&-")
    assert_one_line_error(result.returncode, result.stderr, "standard output is closed", "--output")


def test_translate_to_a_full_stdout_is_one_line(tiny_run, tmp_path):
    if not Path("/dev/full").is_char_device():
        pytest.skip("no /dev/full")
    (tmp_path / "in.txt").write_text("alpha\n" * 50)
    result = attnmt_process(shell=f"{' '.join(ATTNMT)} -q translate --model {tiny_run} --input {tmp_path}/in.txt "
                                  "> /dev/full")
    assert_one_line_error(result.returncode, result.stderr, "standard output: cannot write", "No space left",
                          status=1)  # a full disk (ENOSPC) is the environment's failure


def test_translate_empty_stdin_says_so_and_writes_nothing(tiny_run):
    result = attnmt_process("translate", "--model", str(tiny_run), stdin=subprocess.DEVNULL)
    assert result.returncode == 0 and result.stdout == ""
    assert "no input lines" in result.stderr and "Traceback" not in result.stderr


def test_translate_input_directory_is_one_line(tiny_run, tmp_path, capsys):
    rc, out, err = run_cli(capsys, "translate", "--model", str(tiny_run), "--input", str(tmp_path))
    assert_one_line_error(rc, err, str(tmp_path), "directory")


def test_output_to_a_device_is_written_in_place(tiny_run, tmp_path, capsys):
    """--output /dev/null keeps the device (a rename onto it would replace /dev/null as root);
    --output /dev/full is a one-line write error (exit status 1: no space)."""
    (tmp_path / "in.txt").write_text("alpha\nbravo\n")
    before = Path("/dev/null").stat()
    rc, out, err = run_cli(capsys, "translate", "--model", str(tiny_run), "--input", str(tmp_path / "in.txt"),
                           "--output", "/dev/null")
    assert rc == 0 and err == ""
    after = Path("/dev/null").stat()
    assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)
    if Path("/dev/full").exists():
        rc, out, err = run_cli(capsys, "translate", "--model", str(tiny_run), "--input", str(tmp_path / "in.txt"),
                               "--output", "/dev/full")
        assert_one_line_error(rc, err, "/dev/full", "No space left", status=1)
        assert Path("/dev/full").is_char_device()


def test_atomic_write_through_a_link_keeps_the_link(tmp_path):
    (tmp_path / "real.txt").write_text("old\n")
    (tmp_path / "link.txt").symlink_to("real.txt")
    rundir.atomic_write(tmp_path / "link.txt", lambda tmp: Path(tmp).write_text("new\n"))
    assert (tmp_path / "link.txt").is_symlink() and (tmp_path / "real.txt").read_text() == "new\n"


# ---- a config.yaml edited after training -------------------------------------------------------


@pytest.mark.parametrize("key, value", [
    ("num_heads", 1),  # 2 -> 1: every weight keeps its shape
    ("norm_first", True), ("pre_post_norm", True), ("activation", "gelu"), ("scale_embeddings", False),
    ("positional_layout", "halves"), ("layer_norm_eps", 1e-6), ("ffn_output_activation", True),
    ("tie_output", False), ("positional", "learned"), ("d_model", 32), ("forbidden_ids", [5]),
])
def test_edited_config_is_refused_naming_file_and_key(tiny_run, tmp_path, capsys, key, value):
    edited = edited_copy(tiny_run, tmp_path, "edited", **{key: value})
    (tmp_path / "in.txt").write_text("alpha\n")
    rc, out, err = run_cli(capsys, "translate", "--model", str(edited), "--input", str(tmp_path / "in.txt"))
    assert_one_line_error(rc, err, str(edited / "config.yaml"), f"model.{key}", "model.safetensors")
    assert out == ""


def test_edited_config_names_every_differing_key(tiny_run, tmp_path):
    edited = edited_copy(tiny_run, tmp_path, "edited", num_heads=1, activation="swish")
    with pytest.raises(rundir.CheckpointError, match=r"model\.activation is \"swish\" but the weights were trained "
                                                     r"with \"relu\"; model\.num_heads is 1 but .* with 2"):
        rundir.load_model_dir(edited)


def test_training_only_keys_may_be_edited(tiny_run, tmp_path):
    """Dropout rates (and what acts only when training starts) change nothing at inference: the
    edited directory loads and translates exactly as the original."""
    edited = edited_copy(tiny_run, tmp_path, "edited", dropout=0.3, attention_dropout=0.2, activation_dropout=0.1,
                         time_shared_dropout=True, init="xavier_uniform")
    sentences = ["alpha bravo", "charlie delta echo"]
    original = Translator.from_dir(tiny_run, device="cpu").translate(sentences)
    again = Translator.from_dir(edited, device="cpu").translate(sentences)
    assert [r.hypotheses[0].token_ids for r in again] == [r.hypotheses[0].token_ids for r in original]


def test_weights_record_their_architecture(tiny_run):
    from safetensors import safe_open

    with safe_open(str(tiny_run / "model.safetensors"), "pt") as f:
        recorded = json.loads(f.metadata()[rundir.ARCHITECTURE])
    config = rundir.read_config(tiny_run)
    assert recorded == rundir.architecture(config.model)
    assert recorded["num_heads"] == config.model.num_heads and "dropout" not in recorded


def test_old_model_directory_without_the_record_still_loads(tiny_run, tmp_path):
    """Weights written before the record (or by other tools): loaded with the shape checks only."""
    old = tmp_path / "old"
    shutil.copytree(tiny_run, old, ignore=shutil.ignore_patterns("checkpoints", "data"))
    tensors = load_file(str(old / "model.safetensors"))
    save_file(tensors, str(old / "model.safetensors"), metadata={"step": "12"})
    _, _, _, model = rundir.load_model_dir(old)
    assert all(bool((p == tensors[n]).all()) for n, p in model.state_dict().items() if n in tensors)
    wider = edited_copy(old, tmp_path, "wider", d_model=32)
    with pytest.raises(rundir.CheckpointError, match="do not fit"):
        rundir.load_model_dir(wider)


def test_fine_tuning_from_an_edited_directory_is_refused(tiny_run, tmp_path):
    from attnmt.config import config_from_dict
    from attnmt.train.loop import train
    from tests.conftest import copy_task_config

    edited = edited_copy(tiny_run, tmp_path, "edited", num_heads=1)
    raw = copy_task_config(tmp_path, max_steps=2)
    del raw["model"], raw["tokenizer"]
    raw["train"]["init_from"] = str(edited)
    with pytest.raises(rundir.CheckpointError, match=r"edited/config\.yaml: .*model\.num_heads is 1"):
        train(config_from_dict(raw), tmp_path / "run", progress=False)


# ---- prepare, export, engines, serve -----------------------------------------------------------


def test_prepare_with_more_workers_than_cpus_uses_the_cpus(tmp_path, capsys, caplog):
    import os

    from tests.conftest import copy_task_config

    raw = copy_task_config(tmp_path)
    raw["data"].pop("valid_src"), raw["data"].pop("valid_tgt")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    cpus = len(os.sched_getaffinity(0))
    rc, out, err = run_cli(capsys, "prepare", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "p"),
                           "--workers", str(cpus + 500))
    assert rc == 0 and json.loads(out)["pairs"] == 400
    assert f"--workers {cpus + 500}: this machine has {cpus} CPUs; using {cpus}" in caplog.text


@pytest.mark.parametrize("fmt", ["web", "ctranslate2", "onnx"])
def test_export_to_a_file_is_one_line(tiny_run, tmp_path, capsys, fmt):
    (tmp_path / "out").write_text("keep me\n")
    rc, out, err = run_cli(capsys, "export", fmt, "--model", str(tiny_run), "--output", str(tmp_path / "out"))
    assert_one_line_error(rc, err, "--output", "not a directory")
    assert (tmp_path / "out").read_text() == "keep me\n"


def test_export_of_an_edited_model_is_one_line(tiny_run, tmp_path, capsys):
    pytest.importorskip("onnx")
    edited = edited_copy(tiny_run, tmp_path, "edited", num_heads=1)
    rc, out, err = run_cli(capsys, "export", "onnx", "--model", str(edited), "--output", str(tmp_path / "x"))
    assert_one_line_error(rc, err, "config.yaml", "model.num_heads")
    assert not (tmp_path / "x").exists()


def test_compute_type_for_another_engine_is_one_line(tiny_run, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("alpha\n")
    rc, out, err = run_cli(capsys, "translate", "--model", str(tiny_run), "--input", str(tmp_path / "in.txt"),
                           "--compute-type", "int8")
    assert_one_line_error(rc, err, "--compute-type", "ctranslate2", "native")


@pytest.fixture(scope="module")
def exports(tiny_run, tmp_path_factory) -> dict[str, Path]:
    """The tiny model exported for CTranslate2 and ONNX Runtime (where installed)."""
    return export_engines(tiny_run, tmp_path_factory.mktemp("exports"))


def export_engines(model_dir: Path, root: Path) -> dict[str, Path]:
    """``model_dir`` exported under ``root`` for CTranslate2 and ONNX Runtime, by engine name
    (an engine whose library is not installed is left out)."""
    out = {}
    try:
        from attnmt.interop.ctranslate2 import export_ctranslate2

        out["ctranslate2"] = export_ctranslate2(model_dir, root / "ct2") and root / "ct2"
    except ImportError:
        pass
    try:
        from attnmt.interop.onnx import export_onnx

        out["onnxruntime"] = export_onnx(model_dir, root / "onnx") and root / "onnx"
    except ImportError:
        pass
    return out


def broken_export(exports: dict[str, Path], engine: str, root: Path, name: str, edit) -> Path:
    if engine not in exports:
        pytest.skip(f"no {engine}: pip install 'attnmt[export]'")
    d = root / name
    shutil.copytree(exports[engine], d)
    edit(d)
    return d


@pytest.mark.parametrize("engine, file, edit, needles", [
    ("ctranslate2", "model.bin", lambda b: b[: len(b) // 3], ["CTranslate2 cannot load", "export it again"]),
    ("ctranslate2", "model.bin", lambda b: b"", ["CTranslate2 cannot load", "model.bin"]),
    ("ctranslate2", "config.json", lambda b: b"{", ["CTranslate2 cannot load", "parse error"]),
    ("onnxruntime", "encoder.onnx", lambda b: b[:1000], ["encoder.onnx", "ONNX Runtime cannot load"]),
    ("onnxruntime", "decoder_step.onnx", lambda b: b"", ["decoder_step.onnx", "ONNX Runtime cannot load"]),
])
def test_broken_export_is_one_line(exports, tmp_path, capsys, engine, file, edit, needles):
    d = broken_export(exports, engine, tmp_path, "broken",
                      lambda d: (d / file).write_bytes(edit((d / file).read_bytes())))
    (tmp_path / "in.txt").write_text("alpha\n")
    rc, out, err = run_cli(capsys, "translate", "--model", str(d), "--engine", engine,
                           "--input", str(tmp_path / "in.txt"))
    assert_one_line_error(rc, err, str(d), *needles)
    assert out == ""


def test_native_engine_on_an_export_names_the_engine(exports, tmp_path, capsys):
    d = broken_export(exports, "ctranslate2", tmp_path, "ct2", lambda d: None)
    (tmp_path / "in.txt").write_text("alpha\n")
    rc, out, err = run_cli(capsys, "translate", "--model", str(d), "--input", str(tmp_path / "in.txt"))
    assert_one_line_error(rc, err, str(d), "--engine ctranslate2")


def test_serve_refuses_what_it_could_not_load_before_starting(tiny_run, tmp_path, capsys):
    """A server whose model cannot load would answer every request 500: the mistake is one
    line before it starts (the port is never bound)."""
    pytest.importorskip("uvicorn")
    edited = edited_copy(tiny_run, tmp_path, "edited", activation="gelu")
    cases = [(["--model", str(tiny_run), "--engine", "ctranslate2"], ["model.bin", "attnmt export ctranslate2"]),
             (["--model", str(tiny_run), "--engine", "onnxruntime"], ["encoder.onnx", "attnmt export onnx"]),
             (["--model", str(edited)], ["config.yaml", "model.activation"]),
             (["--model", str(tiny_run), "--weights", str(tmp_path / "none.safetensors")], ["none.safetensors"])]
    for args, needles in cases:
        rc, out, err = run_cli(capsys, "serve", *args, "--port", "1")
        assert_one_line_error(rc, err, *needles)


# ---- terminology constraints -------------------------------------------------------------------


@pytest.mark.parametrize("phrase, needles", [
    ("\u200b", ["has no target token"]),  # a zero-width space: no piece at all
    ("ÄÖ€", ["'ÄÖ€'", "outside the target vocabulary", "<unk>"]),  # the copy task's vocabulary has none
])
def test_unspellable_constraint_is_one_line_naming_its_line(tiny_run, tmp_path, capsys, phrase, needles):
    (tmp_path / "in.txt").write_text("alpha\nbravo\n")
    (tmp_path / "c.txt").write_text(f"alpha\n\t{phrase}\n")
    rc, out, err = run_cli(capsys, "translate", "--model", str(tiny_run), "--input", str(tmp_path / "in.txt"),
                           "--constraints", str(tmp_path / "c.txt"))
    assert_one_line_error(rc, err, f"{tmp_path / 'c.txt'}:2", *needles)
    assert out == ""


def test_blank_constraint_lines_mean_none(tiny_run, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("alpha\nbravo\n")
    (tmp_path / "c.txt").write_text("\t \t\n\n")
    rc, out, err = run_cli(capsys, "translate", "--model", str(tiny_run), "--input", str(tmp_path / "in.txt"),
                           "--constraints", str(tmp_path / "c.txt"))
    plain = run_cli(capsys, "translate", "--model", str(tiny_run), "--input", str(tmp_path / "in.txt"))
    assert rc == 0 and out == plain[1]


def test_translator_refuses_unspellable_constraints_before_any_search(tiny_run):
    from attnmt.decode.translator import ConstraintError

    tr = Translator.from_dir(tiny_run, device="cpu")
    with pytest.raises(ConstraintError, match=r"sentence 2: constraint '\\u200b' has no target token") as e:
        tr.translate(["alpha", "bravo"], constraints=[["alpha"], ["\u200b"]])
    assert (e.value.line, e.value.phrase) == (2, "\u200b")


# ---- the HTTP API and its LibreTranslate face -------------------------------------------------


@pytest.fixture(scope="module")
def client(tiny_run):
    from fastapi.testclient import TestClient

    from attnmt.serve.app import create_app

    tr = Translator.from_dir(tiny_run, device="cpu")
    with TestClient(create_app(lambda: tr, name="tiny", languages=("de", "en")), raise_server_exceptions=False) as c:
        wait_ready(c)
        yield c


LONE_SURROGATE = b'"\\ud800 alpha"'


@pytest.mark.parametrize("body, status, needle", [
    ({"text": "alpha", "constraints": ["\u200b"]}, 422, "constraints: sentence 0: constraint '\\u200b' has no"),
    ({"text": ["alpha", "bravo"], "constraints": [[], ["ÄÖ€"]]}, 422, "sentence 1: constraint 'ÄÖ€' has characters"),
    (b'{"text": ' + LONE_SURROGATE + b"}", 422, "sentence 0: character 0 is a lone surrogate (U+D800)"),
    (b'{"text": "alpha", "constraints": [' + LONE_SURROGATE + b"]}", 422, "constraint 0: character 0 is a lone"),
])
def test_v1_translate_mistakes_are_4xx(client, body, status, needle):
    kwargs = {"json": body} if isinstance(body, dict) else {"content": body,
                                                            "headers": {"content-type": "application/json"}}
    response = client.post("/v1/translate", **kwargs)
    assert response.status_code == status and needle in response.json()["detail"], response.text


def test_v1_translate_stream_lone_surrogate_is_422(client):
    response = client.post("/v1/translate/stream", content=b'{"text": ' + LONE_SURROGATE + b"}",
                           headers={"content-type": "application/json"})
    assert response.status_code == 422 and "lone surrogate" in response.json()["detail"]


@pytest.mark.parametrize("kwargs, needle", [
    ({"content": b'{"q": ' + LONE_SURROGATE + b', "source": "de", "target": "en"}'}, "q 0: character 0 is a lone"),
    ({"json": {"q": ["alpha", 5], "source": "de", "target": "en"}}, "must be strings"),
    ({"json": {"q": 0, "source": "de", "target": "en"}}, "must be strings"),  # there, not missing
    ({"json": {"source": "de", "target": "en"}}, "missing q parameter"),
    ({"data": {"source": "de", "target": "en"}}, "missing q parameter"),  # a form
    ({"json": {"q": "alpha", "source": "fr", "target": "en"}}, "fr is not supported"),
    ({"json": {"q": "alpha", "source": "en", "target": "de"}}, "not available as a target language"),
    ({"content": b"{not json"}, "the body is not JSON"),
    ({"content": b'{"q": "\xff", "source": "de", "target": "en"}'}, "the body is not JSON ('utf-8' codec"),
    ({"json": ["alpha"]}, "must be an object"),
    ({"json": {"q": ["alpha"] * 65, "source": "de", "target": "en"}}, "exceeds text limit"),
])
def test_libretranslate_mistakes_are_400(client, kwargs, needle):
    if "content" in kwargs:
        kwargs["headers"] = {"content-type": "application/json"}
    response = client.post("/translate", **kwargs)
    assert response.status_code == 400 and needle in response.json()["error"], response.text


def test_libretranslate_form_and_json_answer_alike(client):
    fields = {"q": "alpha bravo", "source": "de", "target": "en"}
    as_json, as_form = client.post("/translate", json=fields), client.post("/translate", data=fields)
    assert as_json.status_code == as_form.status_code == 200
    assert as_json.json() == as_form.json() and isinstance(as_json.json()["translatedText"], str)
