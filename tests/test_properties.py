"""Property-based tests (hypothesis) of the translator and the ``translate`` command on hostile
text: arbitrary Unicode (control characters, NUL, CR, U+2028/U+2029, escaped lone surrogates),
empty lines and long lines. Whatever the input, there is no exception and exactly one output
line per input line."""

from __future__ import annotations

import contextlib
import io
import json
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnmt import cli
from attnmt.decode.translator import Translator

# Pieces a hostile line is made of: any character UTF-8 can encode but "\n" (the line
# separator), and some chosen ones, as hypothesis might not draw them in few examples.
SPECIAL = ["\r", "\u2028", "\u2029", "\x00", "\x1b[2J", "\\ud800", "\\udfff", "\ufeff", "\u0085", "\t", " ",
           "alpha", "bravo charlie", "\U0001F600", "\u200b", "x" * 3000]
CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\n")
LINE = st.lists(st.one_of(st.text(CHARS, max_size=20), st.sampled_from(SPECIAL)), max_size=6).map("".join)
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_translators: dict[str, Translator] = {}


def _translator(run_dir) -> Translator:
    if str(run_dir) not in _translators:
        _translators[str(run_dir)] = Translator.from_dir(run_dir)
    return _translators[str(run_dir)]


def test_translator_gives_one_result_per_line(tiny_run):
    @SETTINGS
    @given(lines=st.lists(LINE, max_size=6), beam_size=st.sampled_from([1, 2]))
    def check(lines, beam_size):
        results = _translator(tiny_run).translate(lines, beam_size=beam_size, nbest=beam_size)
        assert len(results) == len(lines)
        assert all(len(r.hypotheses) == beam_size and isinstance(r.text, str) for r in results)

    check()


def _translate_cli(run_dir, data: bytes, *options: str) -> tuple[int, str]:
    stdin, out, err = sys.stdin, io.StringIO(), io.StringIO()
    sys.stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["-q", "translate", "--model", str(run_dir), "--beam-size", "2", *options])
    finally:
        sys.stdin = stdin
    return rc, out.getvalue()


def test_cli_translate_keeps_the_line_count(tiny_run):
    @SETTINGS
    @given(lines=st.lists(LINE, max_size=6), crlf=st.booleans(), fmt=st.sampled_from(["text", "jsonl", "scores"]))
    def check(lines, crlf, fmt):
        data = "".join(line + ("\r\n" if crlf else "\n") for line in lines).encode("utf-8")
        options = ["--scores"] if fmt == "scores" else ["--format", fmt]
        rc, out = _translate_cli(tiny_run, data, *options)
        assert rc == 0
        assert out.count("\n") == len(lines) and (out == "" or out.endswith("\n"))
        if fmt == "jsonl":
            assert [json.loads(row)["id"] for row in out.splitlines()] == list(range(len(lines)))
        if fmt == "scores":
            assert [int(row.split(" ||| ")[0]) for row in out.split("\n")[:-1]] == list(range(len(lines)))

    check()
