"""The stopping rule reaches the search from every interface: ``attnmt translate / evaluate /
serve --early-stopping --patience`` and the ``early_stopping`` / ``patience`` request fields of
``/v1/translate`` and the stream endpoint."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from attnmt import cli
from attnmt.decode.translator import Translator
from attnmt.serve.app import create_app
from attnmt.serve.settings import ServeSettings
from tests.conftest import wait_ready

SENTENCES = ["alpha bravo charlie", "delta echo", "foxtrot golf hotel india juliet alpha", "bravo"]


def test_translate_and_evaluate_take_the_stopping_rule(tiny_run, tmp_path, capsys):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    tr = Translator.from_dir(tiny_run, device="cpu")
    for flags, early, patience in (([], False, 1.0), (["--early-stopping", "true", "--patience", "2"], True, 2.0),
                                   (["--early-stopping", "TRUE"], True, 1.0)):
        out = tmp_path / f"out{len(flags)}.jsonl"
        assert cli.main(["translate", "--model", str(tiny_run), "--input", str(src), "--output", str(out),
                         "--beam-size", "3", "--nbest", "3", "--format", "jsonl", "--device", "cpu", *flags]) == 0
        got = [[h["text"] for h in json.loads(line)["hypotheses"]] for line in out.read_text().splitlines()]
        want = tr.translate(SENTENCES, options=tr.options(3, 3, early_stopping=early, patience=patience))
        assert got == [[h.text for h in t.hypotheses] for t in want]
        assert cli.main(["evaluate", "--model", str(tiny_run), "--src", str(src), "--ref", str(src), "--json",
                         "--beam-size", "3", "--device", "cpu", *flags]) == 0
        scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert (scores["early_stopping"], scores["patience"]) == (early, patience)


@pytest.mark.parametrize("flags, message", [
    (["--patience", "2"], "patience (2.0) applies only to early stopping"),
    (["--early-stopping", "false", "--patience", "1.5"], "patience (1.5) applies only to early stopping"),
    (["--early-stopping", "true", "--patience", "0.5"], "argument --patience: 0.5 is out of range: use a finite number from 1 to"),
    (["--early-stopping", "yes"], "argument --early-stopping: 'yes' is not true or false"),
])
def test_bad_stopping_flags_are_one_line_exit_2(tiny_run, tmp_path, capsys, flags, message):
    src = tmp_path / "src.txt"
    src.write_text("alpha\n", encoding="utf-8")
    for command in (["translate", "--input", str(src)], ["evaluate", "--src", str(src), "--ref", str(src)],
                    ["serve"]):
        with pytest.raises(SystemExit) if "argument" in message else _no_raise() as raised:
            status = cli.main([command[0], "--model", str(tiny_run), *command[1:], *flags])
        status = raised.value.code if "argument" in message else status
        err = capsys.readouterr().err
        assert status == 2 and err.count("\n") == 1 and message in err, (command, err)


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_serve_default_from_the_command_line(tiny_run, monkeypatch):
    import uvicorn

    apps = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: apps.append(app))
    assert cli.main(["serve", "--model", str(tiny_run), "--early-stopping", "true", "--patience", "1.5"]) == 0
    with TestClient(apps[0]) as client:
        wait_ready(client)
        decode = client.get("/v1/models").json()["data"][0]["decode"]
        assert (decode["early_stopping"], decode["patience"]) == (True, 1.5)


@pytest.fixture(scope="module")
def served(tiny_run):
    translator = Translator.from_dir(tiny_run, device="cpu")
    seen = []
    search = translator.translate_ids

    def recording(src_ids, options, batch_size=None):
        seen.append((options.early_stopping, options.patience, len(src_ids)))
        return search(src_ids, options, batch_size)

    translator.translate_ids = recording
    with TestClient(create_app(lambda: translator, ServeSettings(max_wait_ms=1))) as client:
        wait_ready(client)
        yield client, translator, seen


@pytest.mark.parametrize("fields, early, patience", [({}, False, 1.0), ({"early_stopping": True}, True, 1.0),
                                                     ({"early_stopping": True, "patience": 2}, True, 2.0),
                                                     ({"early_stopping": False}, False, 1.0)])
def test_request_fields_reach_the_search(served, fields, early, patience):
    client, translator, seen = served
    seen.clear()
    r = client.post("/v1/translate", json={"text": SENTENCES, "beam_size": 3, "nbest": 2, **fields})
    assert r.status_code == 200, r.text
    assert {s[:2] for s in seen} == {(early, patience)} and sum(s[2] for s in seen) == len(SENTENCES)
    want = translator.translate(SENTENCES, options=translator.options(3, 2, early_stopping=early, patience=patience))
    assert [[h["text"] for h in t["hypotheses"]] for t in r.json()["translations"]] == \
        [[h.text for h in t.hypotheses] for t in want]
    seen.clear()
    with client.stream("POST", "/v1/translate/stream", json={"text": SENTENCES[2], "beam_size": 3, **fields}) as s:
        done = [line for line in s.iter_lines() if line.startswith("data:") and '"hypotheses"' in line]
    assert seen == [(early, patience, 1)]
    assert json.loads(done[-1][5:])["text"] == want[2].text


@pytest.mark.parametrize("fields, detail", [({"patience": 2}, "applies only to early stopping"),
                                            ({"early_stopping": True, "patience": 0.5}, "greater than or equal to 1"),
                                            ({"early_stopping": "yes"}, "bool")])
def test_bad_request_fields_are_422(served, fields, detail):
    client, _, seen = served
    seen.clear()
    r = client.post("/v1/translate", json={"text": "alpha", **fields})
    assert r.status_code == 422 and detail in r.text and not seen
