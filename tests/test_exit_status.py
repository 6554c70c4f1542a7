"""One exit status per kind of failure, decided in one place (``attnmt.errors.exit_status``): 2
for the user's input, 1 for the environment (network, disk, a library, memory), 128 + N for stop
signal N; a bug keeps its traceback. Every exception class of ``attnmt.errors`` is mapped (a new
class fails :func:`test_every_error_class_has_its_status` until it is), and every ``raise`` in
``src/attnmt`` raises one of attnmt's error classes, or is listed in :data:`NOT_FOR_THE_USER`
with why the user's input and the environment cannot reach it as such."""

from __future__ import annotations

import ast
import errno
import json
import signal
from pathlib import Path

import pytest

import attnmt.errors as errors
from attnmt.errors import exit_status
from attnmt.signals import Interrupted
from tests.test_hardening import assert_one_line_error, run_cli

SRC = Path(__file__).resolve().parents[1] / "src" / "attnmt"

# each class of attnmt.errors and the status it ends a command with
STATUS = {"AttnmtError": 2, "ConfigError": 2, "DataError": 2, "CheckpointError": 2, "WriteError": 2,
          "TrainingError": 2, "OptionError": 2, "EnvironmentFailure": 1, "NetworkFailure": 1, "DiskFull": 1}

# raise sites whose exception is not one of attnmt's error classes, by (file under src/attnmt, the
# raised name), and why no user's input or environment reaches a command through them as such
NOT_FOR_THE_USER = {
    ("cli/options.py", "argparse.ArgumentTypeError"): "argparse's own: the parser prints it and exits 2",
    ("config/rules.py", "ValueError"): "inside pydantic validators: config loading makes it a ConfigError",
    ("config/rules.py", "KeyRuleError"): "inside pydantic validators: config loading makes it a ConfigError",
    ("data/download.py", "ConnectionError"): "caught in fetch: a NetworkFailure",
    ("data/download.py", "TimeoutError"): "caught in fetch: a NetworkFailure",
    ("data/text.py", "EOFError"): "caught beside it: a DataError naming the file",
    ("data/shards.py", "ValueError"): "caught beside it: a DataError naming the shard",
    ("train/metrics.py", "ValueError"): "caught beside it: a torn or foreign log line",
    ("data/workers.py", "value"): "a worker's own exception raised again in the parent, of these same kinds",
    ("data/plan.py", "ValueError"): "a bug: a batch plan resumed at a position its own code chose",
    ("decode/alignment.py", "ValueError"): "a bug: attention shapes the translator itself produced",
    ("decode/engine.py", "ValueError"): "a bug: a capability name in attnmt's own code",
    ("decode/translator.py", "ValueError"): "a bug: list lengths the CLI and the server check before calling",
    ("search/constraints.py", "ValueError"): "a bug: one constraint list per sentence, built by the translator",
    ("model/attention.py", "ValueError"): "a bug: batch rows the search itself arranged",
    ("interop/web_graph.py", "ValueError"): "a bug: a graph attnmt's own ONNX export has just written",
    ("train/schedules.py", "ValueError"): "a bug: the schedule name is a Literal of the validated config",
    ("visualize.py", "ValueError"): "a bug: label counts the plot command itself derives from the weights",
    ("distill.py", "RuntimeError"): "a bug: attnmt's own translator returns one line per line",
    ("torchrun.py", "ValueError"): "torchrun's variables, read before the CLI parses; checked by the "
                                   "environment's reader",
    ("serve/app.py", "HTTPException"): "the server's HTTP answer (503), not a command's exit",
    ("serve/app.py", "self.unavailable"): "the server's HTTP answer (503)",
    ("serve/routes.py", "HTTPException"): "the server's HTTP answer (4xx), not a command's exit",
    ("serve/routes.py", "state.busy"): "the server's HTTP answer (429/503)",
    ("serve/batcher.py", "Closed"): "the batcher's own signal to its routes: an HTTP 503",
    ("serve/batcher.py", "QueueFull"): "the batcher's own signal to its routes: an HTTP 429",
    ("signals.py", "Interrupted"): "a stop signal: 128 + N (exit_status)",
    ("signals.py", "KeyboardInterrupt"): "a second Ctrl-C: 130 (exit_status)",
    ("train/loop.py", "Interrupted"): "a stop signal: 128 + N (exit_status)",
    ("autoprecision.py", "ValueError"): "caught beside it: a foreign or stale precision cache, a warning, timed again",
    ("data/manifest.py", "ValueError"): "caught beside it: a DataError naming the manifest",
    ("data/tokenizers.py", "ValueError"): "caught beside it: a CheckpointError naming the vocabulary",
    ("train/checkpoint.py", "ValueError"): "caught beside it: a CheckpointError naming the training state",
    ("train/trainer.py", "ValueError"): "Progress.from_dict's: train/checkpoint.py's reader, which checks a state "
                                        "before the trainer loads it, makes it a CheckpointError",
    ("train/distributed.py", "failed"): "failure()'s peers.PeerLost, an EnvironmentFailure (exit 1)",
    ("serve/documents.py", "DocumentTooLarge"): "the server's HTTP answer (413; LibreTranslate's 400)",
}


def error_classes() -> dict[str, type]:
    return {name: value for name, value in vars(errors).items()
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__}


def test_every_error_class_has_its_status():
    assert set(error_classes()) == set(STATUS)
    for name, cls in error_classes().items():
        assert exit_status(cls("a message")) == STATUS[name], name


def test_signals_memory_and_the_system_have_their_status():
    assert exit_status(Interrupted("SIGTERM")) == 128 + signal.SIGTERM
    assert exit_status(Interrupted("SIGINT")) == 130
    assert exit_status(KeyboardInterrupt()) == 130
    assert exit_status(MemoryError()) == 1
    assert exit_status(type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory")) == 1
    assert exit_status(OSError(errno.ENOSPC, "No space left on device")) == 1
    assert exit_status(PermissionError(errno.EACCES, "Permission denied", "/x")) == 2
    assert exit_status(json.JSONDecodeError("Expecting value", "{", 1)) == 2  # a user's file a library read
    assert exit_status(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")) == 2
    for bug in (ValueError("x"), RuntimeError("x"), KeyError("x"), TypeError("x"), AssertionError()):
        assert exit_status(bug) is None, bug


def attnmt_error_names() -> set[str]:
    """The classes of attnmt.errors and every class in src/attnmt derived from one of them (by name)."""
    known = set(error_classes()) | {"write_error"}  # write_error returns a WriteError or a DiskFull
    classes = [node for path in SRC.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ClassDef)]
    grown = True
    while grown:
        new = {c.name for c in classes if any(ast.unparse(b).split(".")[-1] in known for b in c.bases)} - known
        known |= new
        grown = bool(new)
    return known


def raise_sites() -> dict[tuple[str, str], list[int]]:
    """(file under src/attnmt, the raised name) -> line numbers, of every ``raise X``/``raise X(...)``."""
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                found.setdefault((path.relative_to(SRC).as_posix(), ast.unparse(raised)), []).append(node.lineno)
    return found


def test_every_raise_site_raises_an_error_of_attnmt_or_says_why_not():
    sites = raise_sites()
    assert sum(map(len, sites.values())) > 300  # the walk sees the code's raise sites
    ours = attnmt_error_names()
    assert {"OptionError", "UnsupportedOption", "LanguageError", "ConstraintError"} <= ours
    foreign = {site: lines for site, lines in sites.items()
               if site[1].split(".")[-1] not in ours and site not in NOT_FOR_THE_USER}
    assert not foreign, f"raise an attnmt.errors class (OptionError for a refused value) or list the site: {foreign}"


def test_a_download_refused_by_the_mirror_is_the_environments_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNMT_MULTI30K_URL", "http://127.0.0.1:9/data/task1/raw/")  # nothing listens there
    monkeypatch.delenv("ATTNMT_DATA", raising=False)
    rc, _, err = run_cli(capsys, "download", "multi30k", "--pairs", "de-en", "--data-dir", str(tmp_path))
    assert_one_line_error(rc, err, "environment", "cannot download", "127.0.0.1:9", status=1)


def test_a_folder_the_download_cannot_write_is_the_users(tmp_path, monkeypatch, capsys):
    from attnmt.data import download

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "multi30k"))

    monkeypatch.setattr(download.tempfile, "mkstemp", refuse)
    monkeypatch.setenv("ATTNMT_MULTI30K_URL", "http://127.0.0.1:9/data/task1/raw/")
    rc, _, err = run_cli(capsys, "download", "multi30k", "--pairs", "de-en", "--data-dir", str(tmp_path))
    assert_one_line_error(rc, err, "Permission denied", str(tmp_path / "multi30k"))
    assert "environment" not in err


@pytest.mark.parametrize("error, status, words", [
    (errors.DataError("corpus.txt:3: bad line"), 2, "error: corpus.txt:3"),
    (errors.OptionError("nbest (4) must be between 1 and the beam size (2)"), 2, "error: nbest"),
    (errors.NetworkFailure("cannot download X (Connection refused)"), 1, "error: environment: cannot download"),
    (errors.DiskFull("out.txt: cannot write"), 1, "error: environment: out.txt"),
    (MemoryError(), 1, "error: environment: out of memory"),
])
def test_the_cli_prints_one_line_saying_which_kind(error, status, words, monkeypatch, capsys):
    from attnmt.data import download

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(download, "download_dataset", fail)
    rc, _, err = run_cli(capsys, "download", "multi30k")
    assert_one_line_error(rc, err, words, status=status)


def test_a_bug_keeps_its_traceback(monkeypatch):
    from attnmt.cli import main
    from attnmt.data import download

    def bug(*args, **kwargs):
        raise ValueError("a bug in attnmt")

    monkeypatch.setattr(download, "download_dataset", bug)
    with pytest.raises(ValueError, match="a bug in attnmt"):
        main(["-q", "download", "multi30k"])
