"""Multi30k over real HTTP: an http.server on 127.0.0.1 stands in for upstream (files laid out as
github.com/multi30k/dataset's data/task1/raw/, ATTNMT_MULTI30K_URL pointing at it), and attnmt
runs as its own process with HOME and XDG_CACHE_HOME in a temporary folder and no ATTNMT_DATA.
README command 1's data steps end to end (train, evaluate --testset, translate --testset), the
download command, a preset of several directions trained from the download alone, and each way
a download fails: a changed byte, a connection cut mid-file, a 404, an HTML page, a server that
trickles bytes past the deadline, SIGTERM or SIGINT mid-file. Nothing but a checked file lands in
the cache. The happy paths serve the real files (their SHA-256 are the registry's), read from
$ATTNMT_DATA; the failures need none."""

from __future__ import annotations

import hashlib
import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from attnmt.data.corpus import MULTI30K
from tests.test_hardening import assert_one_line_error

REPO = Path(__file__).resolve().parents[1]
RAW = "/data/task1/raw/"  # upstream's folder of the task-1 files
# A tiny model and run: the preset's data and tokenizer kind, two updates.
TINY = ["train.max_steps=2", "train.valid_bleu=false", "train.log_every=1",
        "train.num_threads=1", "train.batch_sentences=16", "train.precision=fp32", "train.average_last=0",
        "tokenizer.vocab_size=300", "tokenizer.max_sentences=3000", "data.valid_max_sentences=20",
        "model.d_model=32", "model.num_heads=2", "model.d_ff=64", "model.num_encoder_layers=1",
        "model.num_decoder_layers=1", "decode.batch_size=200", "decode.max_len_a=0", "decode.max_len_b=4"]


class Upstream:
    """An HTTP server in a thread: GET .../NAME answers ``files[NAME]`` (bytes, or a function of
    the request handler for a misbehaving server), 404 for any other name. ``requests``: the
    names asked for; ``sending``: set once a misbehaving answer has begun."""

    def __init__(self) -> None:
        self.files: dict[str, object] = {}
        self.requests: list[str] = []
        self.sending = threading.Event()
        self.stop = threading.Event()
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.rsplit("/", 1)[-1]
                upstream.requests.append(name)
                answer = upstream.files.get(name) if self.path.startswith(RAW) else None
                if answer is None:
                    self.send_error(404, "Not Found")
                elif callable(answer):
                    answer(self)
                else:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{RAW}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def cut(self, data: bytes):
        """An answer announcing ``data`` whole and closing the connection halfway."""
        def answer(handler) -> None:
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data[: len(data) // 2])
            handler.wfile.flush()
            handler.close_connection = True
        return answer

    def trickle(self, handler) -> None:
        """A gzip file's first bytes, then one byte every 50 ms for ever (until the client goes or the test ends)."""
        handler.send_response(200)
        handler.send_header("Content-Length", str(10**7))
        handler.end_headers()
        handler.wfile.write(b"\x1f\x8b")
        self.sending.set()
        try:
            while not self.stop.wait(0.05):
                handler.wfile.write(b"\0")
                handler.wfile.flush()
        except OSError:
            pass
        handler.close_connection = True

    def __enter__(self) -> "Upstream":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream():
    with Upstream() as server:
        yield server


@pytest.fixture
def real_upstream(upstream, multi30k_dir):
    """The server holding the real Multi30k files (from $ATTNMT_DATA)."""
    for path in sorted((multi30k_dir / "multi30k").glob("*.gz")):
        upstream.files[path.name] = path.read_bytes()
    return upstream


def user_env(tmp_path: Path, upstream: Upstream, **extra: str) -> dict[str, str]:
    """A new user's environment: HOME and XDG_CACHE_HOME in ``tmp_path``, no ATTNMT_DATA, no proxy,
    ATTNMT_MULTI30K_URL at ``upstream``."""
    env = {k: v for k, v in os.environ.items() if k != "ATTNMT_DATA" and not k.lower().endswith("_proxy")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), ATTNMT_MULTI30K_URL=upstream.url,
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]), **extra)  # this tree's attnmt
    return env


def attnmt(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnmt", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def cached(env: dict[str, str]) -> list[str]:
    """Every file under the cache (a ``.part`` file included)."""
    root = Path(env["XDG_CACHE_HOME"])
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def sets(*items: str) -> list[str]:
    return [x for item in items for x in ("--set", item)]


def bleu_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("BLEU = "))


def scores(stdout: str) -> list[str]:
    """evaluate's lines but the last (sentences, beam, seconds): BLEU, chrF and BLEU's detail."""
    return stdout.splitlines()[:-1]


# ---- the way README command 1 goes ------------------------------------------------------------------


def test_readme_command_1_data_steps_over_http(real_upstream, multi30k_dir, tmp_path):
    env = user_env(tmp_path, real_upstream)
    run = tmp_path / "runs" / "de-en"
    train = attnmt(env, "-q", "train", "configs/multi30k_de_en.yaml", "--output", str(run), *sets(*TINY))
    assert train.returncode == 0, train.stderr
    assert sorted(real_upstream.requests) == ["train.de.gz", "train.en.gz", "val.de.gz", "val.en.gz"]
    assert cached(env) == [f"attnmt/multi30k/{n}" for n in ("train.de.gz", "train.en.gz", "val.de.gz", "val.en.gz")]

    evaluate = attnmt(env, "-q", "evaluate", "--model", str(run), "--testset", "multi30k:test_2016_flickr",
                      "--beam-size", "1")
    assert evaluate.returncode == 0, evaluate.stderr
    assert re.match(r"BLEU = \d+\.\d\d ", bleu_line(evaluate.stdout))
    assert "1000 sentences" in evaluate.stdout  # test_2016_flickr whole
    assert sorted(real_upstream.requests)[:2] == ["test_2016_flickr.de.gz", "test_2016_flickr.en.gz"]

    translate = attnmt(env, "-q", "translate", "--model", str(run), "--testset", "multi30k:test_2016_flickr",
                       "--beam-size", "1")
    assert translate.returncode == 0, translate.stderr
    assert len(translate.stdout.splitlines()) == 1000
    assert len(real_upstream.requests) == 6  # the test set was fetched once
    for name in cached(env):  # each file the registry's
        path = Path(env["XDG_CACHE_HOME"]) / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == MULTI30K.sha256[path.name]

    # the same model given the files locally: --testset reads them (no request) and scores as --src/--ref do
    local = {**env, "ATTNMT_DATA": str(multi30k_dir)}
    by_name = attnmt(local, "-q", "evaluate", "--model", str(run), "--testset", "multi30k:test_2016_flickr",
                     "--beam-size", "1")
    folder = multi30k_dir / "multi30k"
    by_files = attnmt(local, "-q", "evaluate", "--model", str(run), "--beam-size", "1",
                      "--src", str(folder / "test_2016_flickr.de.gz"), "--ref", str(folder / "test_2016_flickr.en.gz"))
    assert by_name.returncode == 0 and by_files.returncode == 0, by_name.stderr + by_files.stderr
    assert scores(by_name.stdout) == scores(by_files.stdout) == scores(evaluate.stdout)
    assert len(scores(evaluate.stdout)) == 3 and "hyp_len" in scores(evaluate.stdout)[2]
    assert len(real_upstream.requests) == 6


def test_download_fetches_every_file_of_the_pairs_and_says_where(real_upstream, tmp_path):
    env = user_env(tmp_path, real_upstream)
    result = attnmt(env, "download", "multi30k", "--pairs", "de-en")
    assert result.returncode == 0, result.stderr
    expected = [f"{split}.{lang}.gz" for split in MULTI30K.splits for lang in ("de", "en")]
    assert cached(env) == sorted(f"attnmt/multi30k/{n}" for n in expected)
    assert f"6 files of multi30k, SHA-256 checked, in {env['XDG_CACHE_HOME']}/attnmt/multi30k" in result.stdout
    assert "%|" not in result.stderr  # no progress bar in a pipe

    again = attnmt(env, "-q", "download", "multi30k", "--pairs", "de-en")  # all there: nothing fetched
    assert again.returncode == 0 and len(real_upstream.requests) == 6

    offline = tmp_path / "offline"
    to_dir = attnmt(env, "-q", "download", "multi30k", "--pairs", "fr-en,de-en", "--data-dir", str(offline))
    assert to_dir.returncode == 0, to_dir.stderr
    assert sorted(p.name for p in (offline / "multi30k").iterdir()) == sorted(
        f"{split}.{lang}.gz" for split in MULTI30K.splits for lang in ("fr", "en", "de"))
    assert f"export ATTNMT_DATA={offline}" in to_dir.stdout


def test_many_to_english_preset_trains_from_the_download_alone(real_upstream, tmp_path):
    env = user_env(tmp_path, real_upstream)
    run = tmp_path / "run"
    result = attnmt(env, "train", "configs/multi30k_many_to_en.yaml", "--output", str(run), *sets(*TINY))
    assert result.returncode == 0, result.stderr
    assert sorted(set(real_upstream.requests)) == sorted(f"{s}.{lang}.gz" for s in ("train", "val")
                                                         for lang in ("cs", "de", "en", "fr"))
    assert re.search(r"multi30k\.train\.cs-en: \d+ of 3000 pairs kept", result.stderr)  # its max_pairs


# ---- each way a download fails: one line, exit 2, nothing in the cache ------------------------------


def test_a_changed_byte_is_one_line_and_nothing_is_kept(real_upstream, tmp_path):
    data = bytearray(real_upstream.files["train.de.gz"])
    data[len(data) // 2] ^= 0x01
    real_upstream.files["train.de.gz"] = bytes(data)
    env = user_env(tmp_path, real_upstream)
    result = attnmt(env, "-q", "download", "multi30k", "--pairs", "de-en")
    digest = hashlib.sha256(data).hexdigest()
    assert_one_line_error(result.returncode, result.stderr, f"{real_upstream.url}train.de.gz", "SHA-256 mismatch",
                          digest, MULTI30K.sha256["train.de.gz"])
    assert cached(env) == []


def login_page(handler) -> None:
    """A proxy's answer in place of the file: an HTML page, status 200."""
    page = b"<!DOCTYPE html><html><body>Please log in to the proxy</body></html>"
    handler.send_response(200)
    handler.send_header("Content-Type", "text/html")
    handler.send_header("Content-Length", str(len(page)))
    handler.end_headers()
    handler.wfile.write(page)


@pytest.mark.parametrize("answer, needles", [
    ("cut", ["train.de.gz", "the connection closed after 5", "of 11"]),
    ("404", ["train.de.gz", "HTTP 404", "ATTNMT_MULTI30K_URL"]),
    ("html", ["train.de.gz", "an HTML page (text/html)", "ATTNMT_DATA"]),
])
def test_a_broken_answer_is_one_line_and_nothing_is_kept(upstream, tmp_path, answer, needles):
    if answer == "cut":
        upstream.files["train.de.gz"] = upstream.cut(b"\x1f\x8b" + b"x" * 9)
    elif answer == "html":
        upstream.files["train.de.gz"] = login_page
    env = user_env(tmp_path, upstream)
    result = attnmt(env, "-q", "download", "multi30k", "--pairs", "de-en", timeout=120)
    # a connection cut is the network's failure (exit 1); a wrong answer, the mirror the user chose (exit 2)
    assert_one_line_error(result.returncode, result.stderr, *needles, status=1 if answer == "cut" else 2)
    assert cached(env) == []


def test_a_trickle_past_the_deadline_is_one_line_and_nothing_is_kept(upstream, tmp_path):
    upstream.files["train.de.gz"] = upstream.trickle
    env = user_env(tmp_path, upstream, ATTNMT_DOWNLOAD_TIMEOUT="2")
    t0 = time.monotonic()
    result = attnmt(env, "-q", "download", "multi30k", "--pairs", "de-en", timeout=120)
    seconds = time.monotonic() - t0
    assert_one_line_error(result.returncode, result.stderr, "train.de.gz", "no complete file within 2 seconds",
                          "ATTNMT_DOWNLOAD_TIMEOUT", status=1)  # the network's failure, not the user's
    assert upstream.sending.is_set() and seconds < 30  # the bytes kept coming, the deadline held
    assert cached(env) == []


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_mid_file_leaves_no_part_file(upstream, tmp_path, stop):
    upstream.files["train.de.gz"] = upstream.trickle
    env = user_env(tmp_path, upstream)
    proc = subprocess.Popen([sys.executable, "-m", "attnmt", "-q", "download", "multi30k", "--pairs", "de-en"],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (upstream.sending.is_set() and cached(env)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cached(env) and cached(env)[0].endswith(".part")  # mid-file
        time.sleep(0.2)
        proc.send_signal(stop)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + stop, err
    assert f"stopped by {stop.name}" in err and "Traceback" not in err
    assert cached(env) == []


def test_a_bad_download_timeout_is_one_line(upstream, tmp_path):
    env = user_env(tmp_path, upstream, ATTNMT_DOWNLOAD_TIMEOUT="soon")
    result = attnmt(env, "-q", "download", "multi30k", "--pairs", "de-en", timeout=120)
    assert_one_line_error(result.returncode, result.stderr, "ATTNMT_DOWNLOAD_TIMEOUT='soon'")
    assert upstream.requests == []


def test_a_progress_bar_on_a_terminal_none_in_a_pipe(upstream, tmp_path):
    import fcntl
    import pty
    import struct
    import termios

    upstream.files["train.de.gz"] = b"\x1f\x8b" + bytes(300_000)  # not the registry's file: refused once fetched
    env = user_env(tmp_path, upstream)
    command = [sys.executable, "-m", "attnmt", "-q", "download", "multi30k", "--pairs", "de-en"]
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    try:
        proc = subprocess.run(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=terminal, timeout=120)
    finally:
        os.close(terminal)
    shown = b""
    while True:
        try:
            block = os.read(master, 1 << 16)
        except OSError:  # the terminal's other end is closed: all read
            break
        if not block:
            break
        shown += block
    os.close(master)
    assert proc.returncode == 2 and b"train.de.gz: " in shown and b"%|" in shown, shown  # tqdm's bar
    piped = attnmt(env, "-q", "download", "multi30k", "--pairs", "de-en", timeout=120)
    assert piped.returncode == 2 and "%|" not in piped.stderr and len(piped.stderr.splitlines()) == 1
