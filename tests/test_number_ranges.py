"""Every number a user gives has a range, checked where it is read: each number key of the
configuration (YAML text and --set overrides), each number option of the command line (run in
this process through ``attnmt.cli.main``) and each number of the HTTP API's requests and of
``serve --set``, given 1e300, -1e300, nan, inf, true and 2**64, is refused in one line naming it
(a 4xx over HTTP, never a 500). The lists are built from the code (the pydantic models, the
argparse actions), so that a key or option added later is covered."""

from __future__ import annotations

import argparse
import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from pydantic import BaseModel

from attnmt import cli, ranges
from attnmt.config import APPLIES_ONLY_TO, Config, config_from_yaml
from attnmt.errors import ConfigError
from attnmt.ranges import C_INT_MAX, numbers_only
from attnmt.search.options import SearchOptions
from attnmt.serve.app import create_app
from attnmt.serve.schemas import TranslateRequest, TranslateStreamRequest
from attnmt.serve.settings import ServeSettings
from tests.conftest import copy_task_config, wait_ready
from tests.test_hardening import assert_one_line_error, run_cli
from tests.test_mistakes_engines import edited_decode, engine_dir, exports  # noqa: F401  (a fixture)

# the hostile numbers, as Python values (YAML and JSON documents are written from them)
HOSTILE = [1e300, -1e300, float("nan"), float("inf"), True, 2**64]
# the same as a user types them on the command line (and YAML's spellings of nan, inf and true)
HOSTILE_TEXT = ["1e300", "-1e300", "nan", "inf", "true", str(2**64)]
HOSTILE_YAML = ["1e300", "-1e300", ".nan", ".inf", "true", "on", str(2**64)]


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models(a)]


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list or any(typing.get_origin(a) is list
                                                       for a in typing.get_args(annotation))


def number_fields(model: type[BaseModel], path: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, annotation) of every number field under ``model``: nested sections and the entries of
    a list of sections (``('data', 'train', 0, 'weight')``) included."""
    out = []
    for name, field in model.model_fields.items():
        if numbers_only(field.annotation):
            out.append(((*path, name), field.annotation))
        for sub in _models(field.annotation):
            out += number_fields(sub, (*path, name, 0) if _is_list(field.annotation) else (*path, name))
    return out


def dotted(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def holding(annotation: Any, default: Any, value: Any) -> Any:
    """``value`` as the field takes it: alone, the first item of a tuple (the others kept), or a
    one-item list."""
    origin = typing.get_origin(annotation)
    if origin is tuple:
        return [value, *list(default)[1:]]
    if origin is list:
        return [value]
    return value


def base_config(tmp_path: Path, path: tuple) -> dict:
    """A valid raw configuration in which the key at ``path`` applies: its option of
    APPLIES_ONLY_TO set, and data.train entries where the key is one of theirs."""
    raw = copy_task_config(tmp_path)
    if path[:2] == ("data", "train"):
        data = raw["data"]
        data["train"] = [{"src": data.pop("train_src"), "tgt": data.pop("train_tgt")}]
    if len(path) == 2 and tuple(path) in APPLIES_ONLY_TO:
        section, option, values = APPLIES_ONLY_TO[tuple(path)]
        raw[section][option] = values[0]
        for (sec, k), (opt_sec, opt, wanted) in APPLIES_ONLY_TO.items():  # drop the knobs of the other values
            if (opt_sec, opt) == (section, option) and values[0] not in wanted:
                raw[sec].pop(k, None)
        if values[0] == "time_budget":
            raw["train"]["max_minutes"] = 10
        if section == "tokenizer" and values[0] == "word":  # without the sentencepiece knobs, with languages
            raw["tokenizer"] = {"kind": "word", "joint": False}
            raw["data"]["pair"] = "de-en"
    return raw


def set_at(raw: dict, path: tuple, value: Any) -> None:
    node = raw
    for p in path[:-1]:
        node = node.setdefault(p, {}) if isinstance(p, str) else node[p]
    node[path[-1]] = value


CONFIG_NUMBERS = number_fields(Config)


def test_the_configuration_walk_finds_the_number_keys():
    keys = {dotted(p) for p, _ in CONFIG_NUMBERS}
    assert {"train.dropout_curriculum", "decode.length_penalty", "data.train[0].weight", "train.adam_betas",
            "model.forbidden_ids", "data.filter.max_length_ratio", "train.num_threads", "train.max_minutes",
            "decode.patience", "train.seed"} <= keys
    assert len(keys) >= 60
    assert not keys & {"train.compile", "decode.early_stopping", "model.norm_first", "train.ddp_overlap"}


@pytest.mark.parametrize("path,annotation", CONFIG_NUMBERS, ids=[dotted(p) for p, _ in CONFIG_NUMBERS])
def test_every_number_key_refuses_hostile_numbers_in_yaml(tmp_path, path, annotation):
    field_default = None
    model: Any = Config
    for p in path:
        if isinstance(p, str):
            field = model.model_fields[p]
            field_default = field.get_default(call_default_factory=True)
            inner = _models(field.annotation)
            model = inner[0] if inner else None
    key = dotted(path)
    for value in HOSTILE:
        raw = base_config(tmp_path, path)
        config_from_yaml(yaml.safe_dump(raw), "base.yaml")  # the base itself is valid
        set_at(raw, path, holding(annotation, field_default, value))
        with pytest.raises(ConfigError) as e:
            config_from_yaml(yaml.safe_dump(raw), "hostile.yaml")
        message = str(e.value)
        assert "\n" not in message and message.startswith("hostile.yaml:"), message
        assert key.replace("[0]", "") in message.replace("[0]", ""), (value, message)
        assert "applies only to" not in message, message  # refused for its value, not for its option


TOP_NUMBERS = [(p, a) for p, a in CONFIG_NUMBERS if 0 not in p and typing.get_origin(a) not in (list, tuple)]


@pytest.mark.parametrize("path,annotation", TOP_NUMBERS, ids=[dotted(p) for p, _ in TOP_NUMBERS])
def test_every_number_key_refuses_hostile_numbers_given_with_set(tmp_path, path, annotation):
    key = dotted(path)
    text = yaml.safe_dump(base_config(tmp_path, path))
    for value in HOSTILE_YAML:
        with pytest.raises(ConfigError) as e:
            config_from_yaml(text, "base.yaml", [f"{key}={value}"])
        message = str(e.value)
        assert "\n" not in message and key in message and "applies only to" not in message, (value, message)


def test_a_boolean_is_not_a_count(tmp_path):
    raw = copy_task_config(tmp_path)
    raw["train"]["dropout_curriculum"] = 300
    text = yaml.safe_dump(raw).replace("dropout_curriculum: 300", "dropout_curriculum: on")
    with pytest.raises(ConfigError, match=r"^my\.yaml:\d+: invalid configuration: train\.dropout_curriculum: a "
                                          r"boolean is not a number"):
        config_from_yaml(text, "my.yaml")
    assert config_from_yaml(text.replace(": on", ": 300"), "my.yaml").train.dropout_curriculum == 300
    for override in ("train.max_steps=yes", "decode.beam_size=true", "train.adam_betas=[0.9, on]",
                     "model.forbidden_ids=[false]", "train.lr=on"):
        with pytest.raises(ConfigError, match=re.escape(override.split("=")[0]) + ": a boolean is not a number"):
            config_from_yaml(text.replace(": on", ": 300"), "my.yaml", [override])


def test_the_length_penalty_range_is_one_rule(tmp_path):
    text = yaml.safe_dump(copy_task_config(tmp_path))
    for alpha in (-10, 0, 0.6, 10):
        assert config_from_yaml(text, "c.yaml", [f"decode.length_penalty={alpha}"]).decode.length_penalty == alpha
        assert SearchOptions(beam_size=4, length_penalty=alpha).length_penalty == alpha
        assert cli.in_range(ranges.LENGTH_PENALTY)(str(alpha)) == alpha
    for alpha in (10.5, -11, 1e6):
        with pytest.raises(ConfigError, match=r"decode\.length_penalty: .* is out of range: must be (at most 10|at "
                                              r"least -10)$"):
            config_from_yaml(text, "c.yaml", [f"decode.length_penalty={alpha}"])
        with pytest.raises(ValueError, match="^length_penalty .* is out of range: use a finite number from -10 to 10$"):
            SearchOptions(beam_size=4, length_penalty=alpha)
        with pytest.raises(argparse.ArgumentTypeError, match="from -10 to 10"):
            cli.in_range(ranges.LENGTH_PENALTY)(str(alpha))


# ---- the command line ------------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            for name, sub in a.choices.items()}


def _is_number_option(action: argparse.Action) -> bool:
    """An option that takes a number: its type makes one of '1', or its default is one."""
    if not action.option_strings or action.nargs == 0:
        return False
    if isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
        return True
    try:
        value = action.type("1") if callable(action.type) else None
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number_options() -> list[tuple[str, str]]:
    return [(command, action.option_strings[-1]) for command, sub in _subparsers(cli.build_parser()).items()
            for action in sub._actions if _is_number_option(action)]


CLI_NUMBERS = number_options()


def test_the_parser_walk_finds_the_number_options():
    found = set(CLI_NUMBERS)
    assert {("translate", "--length-penalty"), ("translate", "--beam-size"), ("serve", "--port"),
            ("train-vectors", "--epochs"), ("prepare", "--workers"), ("distill", "--mix-original"),
            ("translate", "--patience"), ("export", "--int8-weight-bits"), ("plot-positions", "--d-model")} <= found
    assert len(found) >= 40
    assert not {o for _, o in found} & {"--early-stopping", "--scores", "--resume", "--model", "--output"}


@pytest.fixture
def command_bases(tiny_run, tmp_path, monkeypatch) -> dict[str, list[str]]:
    """A valid command line of each subcommand that has number options (a server would not start:
    uvicorn.run records the call instead)."""
    import uvicorn

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: started.append(k))
    (tmp_path / "in.txt").write_text("alpha bravo\n")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(copy_task_config(tmp_path)))
    m, inp, out = str(tiny_run), str(tmp_path / "in.txt"), str(tmp_path / "out")
    return {
        "translate": ["translate", "--model", m, "--input", inp, "--output", out],
        "evaluate": ["evaluate", "--model", m, "--src", inp, "--ref", inp],
        "score": ["score", "--model", m, "--src", inp, "--tgt", inp, "--output", out],
        "plot-attention": ["plot-attention", "--model", m, "alpha", "--output", out + ".png"],
        "plot-positions": ["plot-positions", "--output", out + ".png"],
        "serve": ["serve", "--model", m],
        "distill": ["distill", str(config), "--teacher", m, "--output", out],
        "prepare": ["prepare", str(config), "--output", out],
        "train-vectors": ["train-vectors", str(config), "--side", "src", "--output", out + ".vec"],
        "export": ["export", "onnx", "--model", m, "--output", out],
    }


def test_every_number_option_refuses_hostile_numbers(command_bases, capsys, tmp_path):
    missing = {command for command, _ in CLI_NUMBERS} - set(command_bases)
    assert not missing, f"give a valid command line of {missing} in command_bases"
    for command, option in CLI_NUMBERS:
        for value in HOSTILE_TEXT:
            rc, out, err = run_cli(capsys, *command_bases[command], f"{option}={value}")
            assert "Traceback" not in err, (option, value, err)
            assert_one_line_error(rc, err, option)
            assert out == "" and not (tmp_path / "out").exists(), (option, value)


@pytest.mark.parametrize("engine", ["native", "ctranslate2", "onnxruntime"])
@pytest.mark.parametrize("value", ["1e6", "-1e6", "10.5"])
def test_a_huge_length_penalty_is_one_line_on_every_engine(exports, tmp_path, capsys, engine, value):  # noqa: F811
    (tmp_path / "in.txt").write_text("alpha bravo\n")
    rc, out, err = run_cli(capsys, "translate", "--model", str(engine_dir(exports, engine)), "--engine", engine,
                           "--input", str(tmp_path / "in.txt"), f"--length-penalty={value}", "--beam-size", "4")
    assert_one_line_error(rc, err, "--length-penalty", "from -10 to 10")
    assert out == ""


@pytest.mark.parametrize("engine", ["native", "ctranslate2", "onnxruntime"])
def test_the_length_penalty_bounds_translate_on_every_engine(exports, tmp_path, capsys, engine):  # noqa: F811
    """At -10 and 10 (and a long output: 2 x the source + 30 tokens) the score stays finite."""
    model = edited_decode(engine_dir(exports, engine), tmp_path, max_len_a=2.0, max_len_b=30, early_stopping=True)
    (tmp_path / "in.txt").write_text("alpha bravo charlie delta echo\n")
    for alpha in ("10", "-10"):
        rc, out, err = run_cli(capsys, "translate", "--model", str(model), "--engine", engine, "--input",
                               str(tmp_path / "in.txt"), f"--length-penalty={alpha}", "--beam-size", "4", "--nbest",
                               "4", "--format", "jsonl")
        assert rc == 0 and "Traceback" not in err, err
        hyps = json.loads(out)["hypotheses"]
        assert len(hyps) == 4 and all(h["score"] is not None for h in hyps), out


@pytest.mark.parametrize("engine", ["native", "ctranslate2", "onnxruntime"])
def test_a_huge_length_penalty_in_the_model_config_is_one_line(exports, tmp_path, capsys, engine):  # noqa: F811
    model = edited_decode(engine_dir(exports, engine), tmp_path, length_penalty=1e6)
    (tmp_path / "in.txt").write_text("alpha\n")
    rc, _, err = run_cli(capsys, "translate", "--model", str(model), "--engine", engine, "--input",
                         str(tmp_path / "in.txt"))
    assert_one_line_error(rc, err, "config.yaml", "decode.length_penalty")


# ---- the HTTP API and serve --set --------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(tiny_run, tmp_path_factory):
    """A client of the tiny model, served as a de-en model (LibreTranslate's routes need languages)."""
    import shutil

    from attnmt.interop.engines import open_translator

    model = tmp_path_factory.mktemp("served") / "model"
    shutil.copytree(tiny_run, model, ignore=shutil.ignore_patterns("checkpoints", "data"))
    raw = yaml.safe_load((model / "config.yaml").read_text())
    raw["data"]["pair"] = "de-en"
    (model / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    with TestClient(create_app(lambda: open_translator(model, "native", "cpu"), ServeSettings())) as c:
        wait_ready(c)
        yield c


REQUEST_NUMBERS = [(p, m) for m in (TranslateRequest, TranslateStreamRequest) for p, _ in number_fields(m)]


def test_the_request_walk_finds_the_number_fields():
    assert {(("beam_size",), TranslateRequest), (("nbest",), TranslateRequest),
            (("patience",), TranslateStreamRequest)} <= set(REQUEST_NUMBERS)


@pytest.mark.parametrize("path,model", REQUEST_NUMBERS, ids=[f"{m.__name__}.{dotted(p)}" for p, m in REQUEST_NUMBERS])
def test_every_request_number_refuses_hostile_numbers(client, path, model):
    route = "/v1/translate/stream" if model is TranslateStreamRequest else "/v1/translate"
    for value in HOSTILE:
        for extra in ({}, {"early_stopping": True, "beam_size": 2}):
            body = {"text": "alpha", **extra, path[0]: value}
            r = client.post(route, content=json.dumps(body), headers={"content-type": "application/json"})
            assert r.status_code == 422, (body, r.status_code, r.text)
            assert path[0] in json.dumps(r.json()["detail"]), r.text


@pytest.mark.parametrize("field", ["q", "source", "target", "format"])
def test_libretranslate_numbers_are_400(client, field):
    """LibreTranslate's fields are strings: a number or boolean in any of them is a 400 naming it."""
    [language] = client.get("/languages").json()[:1]
    source, target = language["code"], language["targets"][0]
    ok = {"q": "alpha", "source": source, "target": target}
    assert client.post("/translate", json=ok).status_code == 200
    for value in [*HOSTILE, False, 0]:
        body = {**ok, field: value}
        r = client.post("/translate", content=json.dumps(body), headers={"content-type": "application/json"})
        assert r.status_code == 400 and field in r.json()["error"], (body, r.status_code, r.text)


SETTINGS_NUMBERS = [p[0] for p, _ in number_fields(ServeSettings)]


def test_every_serve_setting_refuses_hostile_numbers(tiny_run, capsys, monkeypatch):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail(f"the server started with {k}"))
    assert {"max_wait_ms", "request_timeout_s", "max_beam_size", "attention_layer"} <= set(SETTINGS_NUMBERS)
    for name in SETTINGS_NUMBERS:
        for value in HOSTILE_YAML:
            rc, _, err = run_cli(capsys, "serve", "--model", str(tiny_run), "--set", f"{name}={value}")
            assert_one_line_error(rc, err, f"--set {name}")


def test_serve_settings_ranges_are_both_sides():
    assert ServeSettings(max_wait_ms=0, request_timeout_s=86400).max_wait_ms == 0
    for bad in (dict(max_beam_size=C_INT_MAX + 1), dict(request_timeout_s=86401), dict(max_wait_ms=float("inf")),
                dict(retry_after_s=True), dict(attention_layer=0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ServeSettings(**bad)
