"""CI: an installed wheel's ``attnmt export web`` writes a page that translates in Chromium.

Run by .ci/run with the second venv's Python (the wheel built from the clone, its ``export`` extra and
playwright; no source tree on the path), in an empty working directory. A toy copy task is trained for
a few seconds with the wheel's ``attnmt train``, exported with ``attnmt export web``, served by a static
file server and translated on the page in Debian's Chromium; the page's translation must equal
``attnmt translate``'s. Exits non-zero with a message where anything differs.
"""

import functools
import http.server
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

BIN = Path(sys.executable).parent
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


def attnmt(*args: str, stdin: str | None = None) -> str:
    return subprocess.run([str(BIN / "attnmt"), "-q", *args], input=stdin, capture_output=True, text=True,
                          check=True).stdout


def main() -> int:
    import attnmt as package

    assert "site-packages" in package.__file__, f"attnmt imported from {package.__file__}, not the installed wheel"
    rng = random.Random(0)
    lines = [" ".join(rng.sample(WORDS, rng.randint(1, 5))) for _ in range(600)]
    for name, part in (("train", lines[:580]), ("valid", lines[580:])):
        for side in ("src", "tgt"):
            Path(f"{name}.{side}").write_text("\n".join(part) + "\n", encoding="utf-8")
    Path("copy.yaml").write_text(
        "data: {train_src: train.src, train_tgt: train.tgt, valid_src: valid.src, valid_tgt: valid.tgt}\n"
        "tokenizer: {vocab_size: 40, model_type: bpe}\n"
        "model: {d_model: 32, num_heads: 2, d_ff: 64, num_encoder_layers: 1, num_decoder_layers: 1, dropout: 0.0}\n"
        "train: {batch_tokens: 600, schedule: inverse_sqrt, lr: 0.003, warmup_steps: 20, max_steps: 150,\n"
        "        valid_every: 150, precision: fp32, seed: 1}\n", encoding="utf-8")
    attnmt("train", "copy.yaml", "--output", "model")
    attnmt("export", "web", "--model", "model", "--output", "site")
    sentence = "charlie alpha golf"
    expected = attnmt("translate", "--model", "model", stdin=sentence + "\n").strip()

    from playwright.sync_api import sync_playwright

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory="site"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{server.server_port}/")
        page.evaluate("window.attnmt.ready")
        got = page.evaluate("(x) => window.attnmt.translate(x)", sentence)
        browser.close()
    server.shutdown()
    if got != expected or not expected:
        print(f"wheel check: the page translated {sentence!r} as {got!r}, attnmt translate as {expected!r}",
              file=sys.stderr)
        return 1
    print(f"wheel check: the installed wheel's web page translates {sentence!r} as {got!r}, as attnmt translate does")
    return 0


if __name__ == "__main__":
    sys.exit(main())
