"""A refused command leaves its output and its inputs as they were: every command of
``build_parser()`` that writes files is run (in this process, ``attnmt.cli.main``) with an input
refused late, after the command has read something (a model, a corpus, a configuration), and
every file and folder under its output and its inputs is compared before and after. A new
command fails :func:`test_every_command_is_covered` until it has a case here (or is listed in
:data:`WRITES_NOTHING`, with why)."""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from attnmt.cli import build_parser
from tests.conftest import copy_task_config
from tests.test_hardening import assert_one_line_error, run_cli

# commands that write no file, and why
WRITES_NOTHING = {"serve": "answers over HTTP; it writes no file"}


def subcommands() -> set[str]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def snapshot(*roots: Path) -> dict[str, tuple | None]:
    """Every file (size, mtime_ns, SHA-256) and folder (None) under ``roots``, by path."""
    found: dict[str, tuple | None] = {}
    for root in roots:
        for path in [root, *sorted(root.rglob("*"))] if root.exists() else []:
            if path.is_dir():
                found[str(path)] = None
            else:
                stat = path.stat()
                found[str(path)] = (stat.st_size, stat.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def write_config(tmp_path: Path, raw: dict) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def model_copy(model: str, tmp_path: Path) -> Path:
    """A copy of a model directory whose weights file is cut short: refused when the weights are read."""
    out = tmp_path / "model"
    shutil.copytree(model, out, ignore=shutil.ignore_patterns("checkpoints", "data"))
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    return out


def sources(tmp_path: Path) -> str:
    path = tmp_path / "src.txt"
    path.write_text("alpha bravo\ncharlie delta echo\n")
    return str(path)


def too_long(tmp_path: Path) -> str:
    """Sentences of which the second needs more positions than the tiny models have (128)."""
    path = tmp_path / "long.txt"
    path.write_text("alpha bravo\n" + " ".join(["charlie delta"] * 200) + "\n")
    return str(path)


def existing_output(tmp_path: Path, name: str) -> str:
    """An output file that exists already: a refused command keeps its content."""
    path = tmp_path / name
    path.write_text("an earlier result\n")
    return str(path)


# Each case: (a work folder, a pytest request for the model fixtures) -> (argv, the words the one-line
# error names). The output is under the work folder; the inputs are there, or named in argv.
CASES = {
    "train": lambda tmp, request: (  # refused after preparing the data and building the model
        ["train", write_config(tmp, copy_task_config(tmp, freeze=["no_such_layer.*"])), "--output", str(tmp / "run")],
        ["train.freeze", "matches no parameter"]),
    "prepare": lambda tmp, request: (  # refused after encoding: every pair is a copy
        ["prepare", write_config(tmp, {**copy_task_config(tmp), "data": {
            **copy_task_config(tmp)["data"], "filter": {"copies": True}}}), "--output", str(tmp / "prepared"),
         "--workers", "1"], ["no usable training pairs"]),
    "train-vectors": lambda tmp, request: (  # refused after reading the corpus: no language for a word tokenizer
        ["train-vectors", write_config(tmp, copy_task_config(tmp)), "--side", "src", "--output", str(tmp / "v.vec")],
        ["no language"]),
    "distill": lambda tmp, request: (  # refused after loading the teacher: a patience without early stopping
        ["distill", write_config(tmp, copy_task_config(tmp)), "--teacher", model(request), "--output",
         str(tmp / "student"), "--early-stopping", "false", "--patience", "2"], ["patience"]),
    "translate": lambda tmp, request: (  # refused after loading the model and reading the input
        ["translate", "--model", model(request), "--input", sources(tmp), "--output", existing_output(tmp, "out.txt"),
         "--beam-size", "2", "--nbest", "3"], ["nbest"]),
    "score": lambda tmp, request: (  # refused after loading the model and encoding the sentences
        ["score", "--model", model(request), "--src", sources(tmp), "--tgt", too_long(tmp), "--output",
         existing_output(tmp, "scores.txt")], ["sentence 2", "max_positions"]),
    "evaluate": lambda tmp, request: (  # refused after loading the model
        ["evaluate", "--model", model(request), "--src", sources(tmp), "--ref", sources(tmp), "--hyp-output",
         existing_output(tmp, "hyp.txt"), "--early-stopping", "false", "--patience", "2"], ["patience"]),
    "export": lambda tmp, request: (  # refused when the weights are read, after the configuration
        ["export", "ctranslate2", "--model", str(model_copy(model(request), tmp)), "--output", str(tmp / "ct2")],
        [str(tmp / "model")]),
    "import": lambda tmp, request: (  # refused after reading config.json: no vocab.json
        ["import", "marian", str(marian_without_vocabulary(tmp)), "--output", str(tmp / "imported")],
        ["vocab.json", "missing"]),
    "plot-attention": lambda tmp, request: (  # refused at translation, after loading the model
        ["plot-attention", "--model", str(request.getfixturevalue("multilingual_model_dir")), "--input",
         sources(tmp), "--output", str(tmp / "plots"), "--tgt-lang", "xx"], ["xx"]),
    "plot-positions": lambda tmp, request: (  # refused after reading the model's configuration
        ["plot-positions", "--model", model(request), "--max-len", "100000", "--output", str(tmp / "pos.png")],
        ["max_positions"]),
    "download": lambda tmp, request: (  # refused at the first file, after reading what DIR/multi30k holds
        ["download", "multi30k", "--pairs", "de-en", "--data-dir", str(unreachable_mirror(tmp, request))],
        ["cannot download"]),
    "plot-training": lambda tmp, request: (  # refused after reading the log: a line that is not JSON
        ["plot-training", str(broken_log_run(model(request), tmp)), "--output", str(tmp / "curves.png")], ["train_log.jsonl"]),
}


# the commands whose late refusal above is the environment's failure (exit 1), not the user's
STATUS = {"download": 1}


def model(request) -> str:
    """The tiny finished run shared by the tests (``tests.conftest.tiny_run``)."""
    return str(request.getfixturevalue("tiny_run"))


def unreachable_mirror(tmp_path: Path, request) -> Path:
    """A data folder holding one file of another pair, with the mirror at a closed port of this
    machine: the download of the first missing file fails."""
    monkeypatch = request.getfixturevalue("monkeypatch")
    monkeypatch.setenv("ATTNMT_MULTI30K_URL", "http://127.0.0.1:9/data/task1/raw/")
    monkeypatch.delenv("ATTNMT_DATA", raising=False)
    folder = tmp_path / "data"
    (folder / "multi30k").mkdir(parents=True)
    (folder / "multi30k" / "train.fr.gz").write_bytes(b"an earlier download")
    return folder


def marian_without_vocabulary(tmp_path: Path) -> Path:
    folder = tmp_path / "marian"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({  # every field the import requires (interop.marian_config)
        "model_type": "marian", "vocab_size": 10, "pad_token_id": 0, "d_model": 16, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "encoder_layers": 1,
        "decoder_layers": 1}))
    return folder


def broken_log_run(model: str, tmp_path: Path) -> Path:
    run = tmp_path / "run_with_log"
    run.mkdir()
    log = (Path(model) / "train_log.jsonl").read_text().splitlines()
    (run / "train_log.jsonl").write_text("\n".join([log[0], "{not json", *log[1:]]) + "\n")
    return run


def test_every_command_is_covered():
    assert set(CASES) | set(WRITES_NOTHING) == subcommands()
    assert not set(CASES) & set(WRITES_NOTHING)


@pytest.mark.parametrize("command", sorted(CASES))
def test_a_refused_command_leaves_its_output_and_inputs_as_they_were(command, tmp_path, request, capsys):
    assert_refused_writing_nothing(CASES[command], tmp_path, request, capsys, status=STATUS.get(command, 2))
    assert not list(tmp_path.parent.glob(f"{tmp_path.name}/**/.*.tmp"))  # no staging folder left either


def assert_refused_writing_nothing(case, tmp_path, request, capsys, *more_needles: str, status: int = 2) -> None:
    """Run ``case``'s command in ``tmp_path/work``: one line naming its needles (and
    ``more_needles``) with ``status``, and the work folder and the command's inputs as they were."""
    work = tmp_path / "work"
    work.mkdir()
    argv, needles = case(work, request)
    inputs = [Path(a) for a in argv if Path(a).is_absolute() and Path(a).exists() and work not in Path(a).parents]
    before = snapshot(work, *inputs)
    rc, out, err = run_cli(capsys, *argv)
    assert_one_line_error(rc, err, *more_needles, *needles, status=status)
    after = snapshot(work, *inputs)
    assert after == before, {path: (before.get(path), after.get(path)) for path in before.keys() | after.keys()
                             if before.get(path) != after.get(path)}


@pytest.fixture(scope="module")
def ctranslate2_teacher(tiny_run, tmp_path_factory) -> Path:
    pytest.importorskip("ctranslate2")
    out = tmp_path_factory.mktemp("teacher") / "ct2"
    assert run_cli_plain("export", "ctranslate2", "--model", str(tiny_run), "--output", str(out)) == 0
    return out


def run_cli_plain(*argv: str) -> int:
    from attnmt.cli import main

    return main(["-q", *argv])


def test_a_refused_distillation_writes_nothing_and_the_corrected_one_runs(ctranslate2_teacher, tmp_path, capsys):
    """A CTranslate2 teacher refuses exact stopping: refused before distill/manifest.json is
    written, so the corrected command (early stopping) into the same --output is not taken for
    a changed distillation."""
    config = write_config(tmp_path, copy_task_config(tmp_path, max_steps=2, valid_every=2))
    student = tmp_path / "student"
    argv = ["distill", config, "--teacher", str(ctranslate2_teacher), "--engine", "ctranslate2", "--output",
            str(student), "--beam-size", "2", "--mix-original", "1"]  # the original pairs: a barely trained teacher
    rc, _, err = run_cli(capsys, *argv, "--early-stopping", "false")
    assert_one_line_error(rc, err, "ctranslate2", "exact_stopping")
    assert not student.exists()
    rc, out, err = run_cli(capsys, *argv, "--early-stopping", "true")
    assert rc == 0, err
    assert json.loads(out)["steps"] == 2 and (student / "distill" / "train.tgt").is_file()
    assert json.loads((student / "distill" / "manifest.json").read_text())["decode"]["early_stopping"] is True


@pytest.mark.parametrize("fmt", ["onnx", "ctranslate2"])
def test_an_export_that_fails_late_leaves_no_output_and_a_rerun_exports(fmt, tiny_run, tmp_path, monkeypatch, capsys):
    """A failure after the weights are converted (a full disk while the tokenizers are copied):
    no half-written export is left, so the same command runs again into the same --output."""
    from attnmt import rundir
    from attnmt.errors import WriteError

    pytest.importorskip("ctranslate2" if fmt == "ctranslate2" else "onnx")

    def full_disk(model_dir, output):
        raise WriteError(f"{output}/config.yaml: cannot write: No space left on device")

    argv = ["export", fmt, "--model", str(tiny_run), "--output", str(tmp_path / "out")]
    with monkeypatch.context() as patch:
        patch.setattr(rundir, "copy_translation_files", full_disk)
        rc, _, err = run_cli(capsys, *argv)
    assert_one_line_error(rc, err, "No space left on device")
    assert list(tmp_path.iterdir()) == []
    rc, _, err = run_cli(capsys, *argv)
    assert rc == 0, err
    assert (tmp_path / "out" / "config.yaml").is_file()


# ---- every refusal site of the writing commands ----
#
# The raise sites of each writing command's ``cmd_*`` function and of the helpers of its own CLI
# module that it calls (walked from the code by :func:`refusal_sites`, each named by the first
# words of its message), each with a case that reaches it: the refused command leaves its output
# and its inputs as they were. A new site fails :func:`test_every_refusal_site_has_a_case`.

CLI = Path(__file__).resolve().parents[1] / "src" / "attnmt" / "cli"


def _fragment(node) -> str:
    """The longest constant text of a raise's message (its words the error line shows)."""
    texts = [c.value.strip(" ;:") for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return max(texts, key=len, default="")


def refusal_sites() -> dict[str, set[str]]:
    """command -> the message fragments of the raise sites its cmd_* function and the same-module
    helpers it calls hold, for every command of :data:`CASES` (the writing commands)."""
    found: dict[str, set[str]] = {}
    for path in sorted(CLI.glob("*.py")):
        functions = {n.name: n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
        for name, function in functions.items():
            command = name.removeprefix("cmd_").replace("_", "-")
            if not name.startswith("cmd_") or command not in CASES:
                continue
            called = {c.func.id for c in ast.walk(function) if isinstance(c, ast.Call)
                      and isinstance(c.func, ast.Name) and c.func.id in functions}
            found[command] = {_fragment(r) for f in [function, *(functions[c] for c in called)]
                              for r in ast.walk(f) if isinstance(r, ast.Raise) and r.exc is not None}
    return found


def _constraints(tmp: Path, text: str) -> str:
    path = tmp / "constraints.txt"
    path.write_text(text)
    return str(path)


# (command, the fragment of the site) -> case, as CASES
SITE_CASES = {
    ("export", "web export: --quantization is int8 or float32; --int8-weight-bits applies to the ctranslate2 "
                "export only"): lambda tmp, request: (
        ["export", "web", "--model", model(request), "--output", str(tmp / "web"), "--quantization", "int16"], []),
    ("export", "--quantization and --int8-weight-bits apply to the ctranslate2 export only"): lambda tmp, request: (
        ["export", "onnx", "--model", model(request), "--output", str(tmp / "onnx"), "--quantization", "int8"], []),
    ("plot-attention", "give either a SENTENCE or --input FILE"): lambda tmp, request: (
        ["plot-attention", "--model", model(request), "--output", str(tmp / "a.png")], []),
    ("plot-attention", "--layer must be between 1 and"): lambda tmp, request: (
        ["plot-attention", "--model", model(request), "--input", sources(tmp), "--output", str(tmp / "plots"),
         "--layer", "5"], []),
    ("plot-positions", "--layout applies without --model only (a model's layout is its own)"): lambda tmp, request: (
        ["plot-positions", "--model", model(request), "--layout", "halves", "--output",
         existing_output(tmp, "p.png")], []),
    ("plot-positions", "--d-model must be even (sines and cosines in pairs), not"): lambda tmp, request: (
        ["plot-positions", "--d-model", "7", "--output", existing_output(tmp, "p.png")], []),
    ("plot-training", "no such file; is"): lambda tmp, request: (
        ["plot-training", str(tmp), "--output", existing_output(tmp, "curves.png")], []),
    ("train", "pass --resume or --auto-resume to continue it or choose another --output"): lambda tmp, request: (
        ["train", write_config(tmp, copy_task_config(tmp)), "--output", str(finished_run(tmp, request))], []),
    ("download", "expected pairs separated by commas, e.g. de-en,fr-en"): lambda tmp, request: (  # an empty pair
        ["download", "multi30k", "--pairs", "de-en,", "--data-dir", str(unreachable_mirror(tmp, request))],
        ["'de-en,'"]),
    ("prepare", "no data section: nothing to prepare"): lambda tmp, request: (
        ["prepare", write_config(tmp, {"model": {"d_model": 16, "num_heads": 2}}), "--output",
         str(tmp / "prepared")], []),
    ("train-vectors", "no language for the tokenizer: set data.pair or tokenizer.src_lang/tgt_lang"):
        lambda tmp, request: CASES["train-vectors"](tmp, request)[:1] + ([],),
    ("translate", "give --testset or --input, not both"): lambda tmp, request: (
        ["translate", "--model", model(request), "--input", sources(tmp), "--testset", "multi30k:test_2016_flickr",
         "--output", existing_output(tmp, "out.txt")], []),
    ("translate", "--src-lang picks the source side of --testset: give --testset"): lambda tmp, request: (
        ["translate", "--model", model(request), "--input", sources(tmp), "--src-lang", "de", "--output",
         existing_output(tmp, "out.txt")], []),
    ("translate", "input lines (one line of tab-separated phrases per input line; an empty line for none)"):
        lambda tmp, request: (["translate", "--model", model(request), "--input", sources(tmp), "--constraints",
                               _constraints(tmp, "a\n"), "--output", existing_output(tmp, "out.txt")], []),
    ("translate", "constraint"): lambda tmp, request: (  # a phrase the target vocabulary cannot spell
        ["translate", "--model", model(request), "--input", sources(tmp), "--constraints",
         _constraints(tmp, "\u4e2d\u6587\n\n"), "--output", existing_output(tmp, "out.txt")], []),
    ("evaluate", "give --testset (a named test set such as multi30k:test_2016_flickr) or --src and --ref"):
        lambda tmp, request: (["evaluate", "--model", model(request), "--hyp-output",
                               existing_output(tmp, "hyp.txt")], []),
    ("evaluate", "give both --src and --ref (or --testset)"): lambda tmp, request: (
        ["evaluate", "--model", model(request), "--src", sources(tmp), "--hyp-output",
         existing_output(tmp, "hyp.txt")], []),
    ("evaluate", "no sentences to evaluate"): lambda tmp, request: (
        ["evaluate", "--model", model(request), "--src", empty(tmp), "--ref", empty(tmp), "--hyp-output",
         existing_output(tmp, "hyp.txt")], []),
    ("evaluate", "--src-lang picks the source side of --testset: give --testset"): lambda tmp, request: (
        ["evaluate", "--model", model(request), "--src", sources(tmp), "--ref", sources(tmp), "--src-lang", "de",
         "--hyp-output", existing_output(tmp, "hyp.txt")], []),
}

# sites no case reaches on a test machine, and why
UNREACHED = {
    ("train", "lower the learning rate (train.lr or train.lr_factor) or set train.clip_norm, then --resume"):
        "training stopped by non-finite updates: tests/test_hardening.py drives it through the trainer, and what "
        "it keeps there",
    ("train", "continue with --auto-resume or --resume"):
        "a peer of a multi-machine training went silent (attnmt.train.peers.PeerLost): tests/test_two_machines.py "
        "cuts the link between two network namespaces and checks the one line and rank 0's last checkpoint",
}


def empty(tmp: Path) -> str:
    path = tmp / "empty.txt"
    path.write_text("")
    return str(path)


def finished_run(tmp: Path, request) -> Path:
    """A copy of the tiny finished run: training into it again without --resume is refused."""
    out = tmp / "finished"
    shutil.copytree(model(request), out)
    return out


def test_every_refusal_site_has_a_case():
    sites = {(command, fragment) for command, fragments in refusal_sites().items() for fragment in fragments}
    assert len(sites) >= 15  # the walk finds the sites it is meant to
    assert sites == set(SITE_CASES) | set(UNREACHED)


@pytest.mark.parametrize("site", sorted(SITE_CASES), ids=lambda site: f"{site[0]}: {site[1][:40]}")
def test_every_refusal_site_leaves_output_and_inputs_as_they_were(site, tmp_path, request, capsys):
    assert_refused_writing_nothing(SITE_CASES[site], tmp_path, request, capsys, site[1])
