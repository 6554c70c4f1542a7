"""Every value from outside the parser is checked as the parser checks its own: the environment
variables attnmt reads (walked from the source: no module but attnmt.environment reads
``os.environ``), the fields of the files it reads back (walked from their file models: the
prepared directory's manifest, a resumed training state's progress, an imported MarianMT
config.json) and each number inside a list- or dict-valued configuration key. Each is given
1e300, -1e300, nan, inf, true, 2**64, "abc", "" and a negative, and refused in one line naming
the variable, file or field wherever its range does not hold the value."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel

from attnmt import autoprecision, environment, ranges, torchrun
from attnmt.config import Config, config_from_dict
from attnmt.data.corpus import base_url, cache_dir, dataset_file, MULTI30K
from attnmt.data.download import download_timeout
from attnmt.data.manifest import MANIFEST, CorpusEntry, FileRecord, Manifest, SplitRecord, TrainRecord, ValidSet
from attnmt.errors import AttnmtError, CheckpointError, ConfigError, DataError, EnvironmentFailure
from attnmt.interop.marian_config import MarianConfig, read_beam_size, read_marian_config
from attnmt.train.checkpoint import load_state
from attnmt.train import peers
from attnmt.train.compiling import compiler_missing
from attnmt.train.trainer import Progress
from tests.test_hardening import assert_one_line_error, run_cli

SRC = Path(__file__).resolve().parents[1] / "src" / "attnmt"

HOSTILE: list[Any] = [1e300, -1e300, float("nan"), float("inf"), True, 2**64, "abc", "", -1]
HOSTILE_TEXT = ["1e300", "-1e300", "nan", "inf", "true", str(2**64), "abc", "", "-1"]


# ---- the environment -------------------------------------------------------------------------------


def _environ_reads() -> list[str]:
    """'module:line' of every read of the environment in src/attnmt: ``os.environ`` (but a
    ``setdefault`` handing a library its default), ``os.getenv``, ``environ`` imported by name."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        writes = {id(node.func.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Attribute) and node.func.attr == "setdefault"}
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb", "getenvb"):
                name = node.attr
            elif isinstance(node, ast.ImportFrom) and node.module == "os":
                name = next((a.name for a in node.names if a.name in ("environ", "getenv")), None)
            if name and id(node) not in writes:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_only_the_environment_module_reads_the_environment():
    reads = _environ_reads()
    assert reads and all(r.startswith("environment.py:") for r in reads), \
        f"read the variable through attnmt.environment (a Variable with its check): {reads}"


def test_every_variable_the_source_names_is_declared():
    """Each Variable(...) of attnmt.environment is in VARIABLES, and each is exercised below."""
    tree = ast.parse((SRC / "environment.py").read_text(encoding="utf-8"))
    declared = {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "Variable"}
    assert declared == set(environment.VARIABLES) == set(EXERCISE), (declared, set(EXERCISE))


# Each variable with how attnmt uses it: in-process, the environment patched.
EXERCISE = {
    "ATTNMT_DOWNLOAD_TIMEOUT": lambda: download_timeout(),
    "ATTNMT_MULTI30K_URL": lambda: base_url(MULTI30K),
    "ATTNMT_DATA": lambda: dataset_file("multi30k", "val", "de"),
    "XDG_CACHE_HOME": lambda: cache_dir("multi30k"),
    "ATTNMT_PRECISION_CACHE": lambda: autoprecision.cache_file(),
    "CXX": lambda: compiler_missing(torch.device("cpu")),
    "RANK": lambda: torchrun.from_env(),
    "WORLD_SIZE": lambda: torchrun.from_env(),
    "LOCAL_RANK": lambda: torchrun.from_env(),
    "MASTER_ADDR": lambda: peers.own_address(),
    "MASTER_PORT": lambda: peers.own_address() if os.environ.get("MASTER_ADDR") else
    peers.own_address({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": os.environ["MASTER_PORT"]}),
    "TORCHELASTIC_MAX_RESTARTS": lambda: peers.restarts_text(),
    "TORCHELASTIC_RESTART_COUNT": lambda: peers.restarts_text({**os.environ, "TORCHELASTIC_MAX_RESTARTS": "2"}),
}


@pytest.mark.parametrize("name", sorted(environment.VARIABLES))
@pytest.mark.parametrize("text", HOSTILE_TEXT + ["  ", "0x10", "1_0", "５", "http://[::1", "ftp://host/", "http://"])
def test_every_variable_refuses_or_takes_a_hostile_value_in_one_line(name, text, monkeypatch, tmp_path):
    """A number variable refuses whatever its range does not hold, naming itself; a path or
    command is a name (any text), whose use ends in a value or an AttnmtError, never another
    exception; an empty value is unset."""
    variable = environment.VARIABLES[name]
    for other in environment.VARIABLES:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(name, text)
    if variable.kind == "number":
        try:
            value = int(text.strip(), 10) if variable.range.integer else float(text)
        except ValueError:
            value = None
        if text.strip() and (value is None or not variable.range.contains(value)):
            with pytest.raises(ConfigError, match=f"^{name}="):
                EXERCISE[name]()
            return
    if variable.kind == "url" and text.strip():
        with pytest.raises(ConfigError, match=f"^{name}=.* is not a URL"):
            EXERCISE[name]()
        return
    try:
        EXERCISE[name]()
    except (AttnmtError, EnvironmentFailure) as e:  # a mistake, or a download refused by an offline machine
        assert "\n" not in str(e)


@pytest.mark.parametrize("text", ["1e300", "-1e300", "nan", "inf", "true", str(2**64), "abc", "-1", "1e10"])
def test_the_download_timeout_from_the_environment_is_one_line(text, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("ATTNMT_DOWNLOAD_TIMEOUT", text)
    monkeypatch.setenv("ATTNMT_MULTI30K_URL", (tmp_path / "mirror").as_uri())
    rc, _, err = run_cli(capsys, "download", "multi30k", "--pairs", "de-en", "--data-dir", str(tmp_path / "d"))
    assert_one_line_error(rc, err, f"ATTNMT_DOWNLOAD_TIMEOUT={text!r}")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("pairs", ["", ",", "de-en,", " , de-en"])
def test_an_empty_pair_in_the_download_is_one_line(pairs, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "download", "multi30k", "--pairs", pairs, "--data-dir", str(tmp_path / "d"))
    assert_one_line_error(rc, err, f"--pairs {pairs!r}")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("name, text", [("WORLD_SIZE", "nan"), ("WORLD_SIZE", "0"), ("RANK", "-1"),
                                        ("LOCAL_RANK", str(2**64)), ("RANK", "3")])
def test_a_hostile_torchrun_variable_stops_training_in_one_line(name, text, tmp_path, capsys, monkeypatch):
    import yaml

    from tests.conftest import copy_task_config

    for other in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, text)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(copy_task_config(tmp_path, max_steps=1)))
    rc, _, err = run_cli(capsys, "train", str(tmp_path / "c.yaml"), "--output", str(tmp_path / "run"))
    assert_one_line_error(rc, err, f"{name}=")
    assert not (tmp_path / "run").exists()


# ---- the file models --------------------------------------------------------------------------------


def _paths(cls: type, metadata: Any = None) -> list[tuple[tuple, Any, Any]]:
    """(path, annotation, metadata) of every scalar field of the dataclass ``cls`` and of the
    records it holds: a list's or dict's first item (index 0, key 'x'), a shard record's keys."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        for sub, annotation, meta in _scalar_paths(hints[f.name], f.metadata):
            out.append(((f.name, *sub), annotation, meta))
    return out


def _scalar_paths(annotation: Any, metadata: Any) -> list[tuple[tuple, Any, Any]]:
    args = [a for a in typing.get_args(annotation) if a is not type(None) and a is not Ellipsis]
    origin = typing.get_origin(annotation)
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        return _scalar_paths(args[0], metadata)
    if dataclasses.is_dataclass(annotation):
        return _paths(annotation)
    if origin in (list, tuple):
        return [((0, *p), a, m) for p, a, m in _scalar_paths(args[0], metadata)]
    if origin is dict:
        return [(("x", *p), a, m) for p, a, m in _scalar_paths(args[1], metadata)]
    if annotation is dict and "items" in metadata:
        return [((key,), kind if isinstance(kind, type) else int, {"range": kind})
                for key, kind in metadata["items"].items()]
    if annotation in (int, float, str, bool):
        return [((), annotation, metadata)]
    return []


def _refused(annotation: Any, metadata: Any, value: Any) -> bool:
    """Whether the reader must refuse ``value`` for a field of this kind."""
    if annotation in (int, float):
        default = ranges.COUNT if annotation is int else ranges.SECONDS
        return not metadata.get("range", default).contains(value)
    return not isinstance(value, annotation)


def _set(document: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        document = document[key]
    document[path[-1]] = value


def _manifest() -> Manifest:
    file = FileRecord("a.de", 10, 1, "0" * 64)
    shard = {"name": "train.00000", "pairs": 2, "src_tokens": 5, "tgt_tokens": 6}
    corpus = CorpusEntry("c0", 1.0, 0, 2, 2, {"x": 0}, file, file, "de", "en", 2)
    split = SplitRecord([dict(shard, name="valid.00000")], 2, 2, {"x": 0}, file, file)
    return Manifest("uint16", {"x": "0" * 64}, {}, {}, TrainRecord(2, 2, {"x": 0}, [shard], [corpus]), split,
                    {"valid.0": split}, [ValidSet("de-en", "valid.0", "de", "en")], "f" * 64, 1.0, 1.0)


def _manifest_cases() -> list[tuple[str, tuple, Any, Any]]:
    cases = []
    for path, annotation, meta in _paths(Manifest):
        if path[0] in ("splits", "format"):  # 'valid.0' is written at the top level; format is checked first
            continue
        cases.append((".".join(map(str, path)), path, annotation, meta))
    return cases


def test_the_manifest_walk_finds_its_fields():
    names = {name for name, *_ in _manifest_cases()}
    assert {"train.corpora.0.weight", "train.shards.0.pairs", "valid.src.mtime_ns", "seconds",
            "train.dropped.x", "valid_sets.0.src_lang"} <= names, names


@pytest.mark.parametrize("name, path, annotation, meta", _manifest_cases(), ids=[c[0] for c in _manifest_cases()])
def test_every_manifest_field_refuses_hostile_values(name, path, annotation, meta, tmp_path):
    _manifest().save(tmp_path)
    good = json.loads((tmp_path / MANIFEST).read_text())
    Manifest.load(tmp_path)  # the unchanged one reads
    for value in HOSTILE:
        document = json.loads(json.dumps(good))
        _set(document, path, value)
        (tmp_path / MANIFEST).write_text(json.dumps(document))
        if _refused(annotation, meta, value) or (path == ("token_dtype",)):
            with pytest.raises(DataError) as e:
                Manifest.load(tmp_path)
            field = ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[")
            assert str(e.value).startswith(str(tmp_path / MANIFEST)) and "\n" not in str(e.value)
            assert field in str(e.value) or path == ("token_dtype",), (field, str(e.value))
        else:
            Manifest.load(tmp_path)


def test_a_manifest_shard_name_cannot_be_a_number(tmp_path):
    manifest = _manifest()
    manifest.train.shards[0]["name"] = 7
    manifest.save(tmp_path)
    with pytest.raises(DataError, match=r"train\.shards\[0\]\.name 7 is not a text"):
        Manifest.load(tmp_path)


@pytest.mark.parametrize("path, annotation, meta", _paths(Progress), ids=[".".join(map(str, p)) for p, *_ in
                                                                           _paths(Progress)])
def test_every_progress_field_refuses_hostile_values(path, annotation, meta, tmp_path):
    good = dataclasses.asdict(Progress(step=3))
    good["best_key"] = list(good["best_key"])
    state = tmp_path / "last.pt"
    for value in HOSTILE:
        progress = json.loads(json.dumps(good))
        _set(progress, path, value)
        torch.save({"progress": progress, "world_size": 1}, state)
        if _refused(annotation, meta, value):
            with pytest.raises(CheckpointError, match=rf"^{re.escape(str(state))}: progress\.{path[0]}"):
                load_state(state)
        else:
            load_state(state)


@pytest.mark.parametrize("value", HOSTILE)
def test_a_resumed_states_world_size_is_checked(value, tmp_path):
    torch.save({"progress": {"step": 1}, "world_size": value}, tmp_path / "last.pt")
    with pytest.raises(CheckpointError, match="world_size"):
        load_state(tmp_path / "last.pt")


MARIAN = {"model_type": "marian", "vocab_size": 100, "pad_token_id": 99, "eos_token_id": 0, "d_model": 32,
          "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
          "encoder_layers": 2, "decoder_layers": 2, "decoder_start_token_id": 99, "dropout": 0.1,
          "max_position_embeddings": 128, "activation_function": "swish", "scale_embedding": True}


@pytest.mark.parametrize("path, annotation, meta", _paths(MarianConfig), ids=[p[0] for p, *_ in _paths(MarianConfig)])
def test_every_marian_config_field_refuses_hostile_values(path, annotation, meta, tmp_path):
    read_marian_config(MARIAN, tmp_path / "config.json")
    for value in HOSTILE:
        hf = dict(MARIAN, **{path[0]: value})
        if _refused(annotation, meta, value) or (path[0].endswith("_id") and not ranges.Range(0, 99).contains(value)):
            with pytest.raises(CheckpointError, match=rf"^{re.escape(str(tmp_path / 'config.json'))}: {path[0]}"):
                read_marian_config(hf, tmp_path / "config.json")
        else:
            read_marian_config(hf, tmp_path / "config.json")


@pytest.mark.parametrize("value", HOSTILE + [0])
def test_a_generation_configs_beam_size_is_checked(value, tmp_path):
    assert read_beam_size({"num_beams": 6}, tmp_path / "generation_config.json") == 6
    with pytest.raises(CheckpointError, match="num_beams"):
        read_beam_size({"num_beams": value}, tmp_path / "generation_config.json")


@pytest.mark.parametrize("value", HOSTILE)
def test_import_marian_names_the_config_field(value, tmp_path, capsys):
    source = tmp_path / "hf"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(dict(MARIAN, d_model=value)))
    rc, _, err = run_cli(capsys, "import", "marian", str(source), "--output", str(tmp_path / "out"))
    assert_one_line_error(rc, err, "config.json", "d_model")
    assert not (tmp_path / "out").exists()


# ---- numbers inside list- and dict-valued configuration keys -----------------------------------------


def _container_number_fields(model: type[BaseModel], path: tuple = ()) -> list[tuple[tuple, Any]]:
    out = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        for arg in [annotation, *typing.get_args(annotation)]:
            origin = typing.get_origin(arg)
            if origin in (list, tuple, dict) and ranges.numbers_only(arg) and not (
                    origin is dict and not ranges.numbers_only(typing.get_args(arg)[1])):
                out.append(((*path, name), arg))
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out += _container_number_fields(arg, (*path, name))
    return out


def test_the_walk_finds_the_list_and_dict_number_keys():
    found = {".".join(p) for p, _ in _container_number_fields(Config)}
    assert {"data.max_pairs", "model.forbidden_ids", "train.adam_betas"} <= found, found


@pytest.mark.parametrize("path, annotation", _container_number_fields(Config),
                         ids=[".".join(p) for p, _ in _container_number_fields(Config)])
def test_each_number_inside_a_list_or_dict_key_is_checked(path, annotation):
    base = {"data": {"dataset": "multi30k", "pairs": ["de-en", "fr-en"]}}
    origin = typing.get_origin(annotation)
    for value in HOSTILE:
        if origin is dict:
            container: Any = {"de-en": 5, "fr-en": value}
        elif origin is tuple:
            container = [0.9, value]
        else:
            container = [0, value]
        raw = json.loads(json.dumps(base))
        raw.setdefault(path[0], {})
        _set(raw, path, container)
        with pytest.raises(ConfigError, match=rf"{path[-1]}"):
            config_from_dict(raw)


# ---- the benchmark driver's numbers ---------------------------------------------------------------------


def _benchmark_number_options() -> list[tuple[str, Any]]:
    import argparse

    from benchmarks.__main__ import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [(f"{suite} --{a.dest}", a) for suite, p in sub.choices.items() for a in p._actions
            if a.type is not None and getattr(a.type, "__name__", "") in ("int", "float", "integer", "number")]


def test_the_benchmark_walk_finds_its_number_options():
    names = {name for name, _ in _benchmark_number_options()}
    assert {"translate --beam", "serve --seconds", "data --sizes", "quality --default_alpha", "train --updates"} <= names, names


@pytest.mark.parametrize("name, action", _benchmark_number_options(), ids=[n for n, _ in _benchmark_number_options()])
def test_every_benchmark_number_option_has_a_range(name, action):
    import argparse

    from benchmarks.__main__ import COUNTS, OPTION_RANGES

    assert action.type not in (int, float), f"{name}: a bare {action.type.__name__}, no range"
    negative_allowed = OPTION_RANGES.get(action.dest, COUNTS).contains(-1)
    for text in HOSTILE_TEXT:
        if text == "-1" and negative_allowed:  # a length penalty's alpha may be negative
            assert action.type(text) == -1
            continue
        with pytest.raises(argparse.ArgumentTypeError):
            action.type(text)


def test_step_checkpoint_names_read_back_are_checked(tmp_path):
    """A file beside the step checkpoints whose name is not step_N (a copy, a hostile N) is left
    alone, not parsed into a traceback."""
    from attnmt.train.checkpoint import checkpoint_step, step_checkpoints

    (tmp_path / "checkpoints").mkdir()
    names = ["step_10", "step_2", "step_abc", "step_1e300", "step_-1", f"step_{2**64}", "step_", "step_3 copy"]
    for name in names:
        (tmp_path / "checkpoints" / f"{name}.safetensors").write_bytes(b"")
    assert [p.stem for p in step_checkpoints(tmp_path)] == ["step_2", "step_10"]
    assert checkpoint_step(Path("step_007.safetensors")) == 7


def test_a_training_log_with_hostile_values_still_draws(tmp_path):
    """plot-training reads train_log.jsonl back: values that are not finite numbers are left out of
    the figure, not drawn as 1 (a boolean) or passed to matplotlib."""
    pytest.importorskip("matplotlib")
    from attnmt.visualize import plot_training

    lines = [{"kind": "train", "step": 1, "loss": 5.0, "lr": 1e-3}]
    lines += [{"kind": "train", "step": 2 + i, "loss": value, "lr": value} for i, value in enumerate(HOSTILE)]
    lines += [{"kind": "valid", "step": value, "valid_ppl": 3.0, "valid_bleu": 1.0} for value in HOSTILE]
    (tmp_path / "train_log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    plot_training(tmp_path, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 0


def test_a_relative_xdg_cache_home_is_ignored_as_the_xdg_specification_says(monkeypatch, tmp_path):
    from attnmt import environment

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert environment.cache_home({"XDG_CACHE_HOME": "cache"}) == tmp_path / "home" / ".cache"
    assert environment.cache_home({"XDG_CACHE_HOME": "./x/../cache"}) == tmp_path / "home" / ".cache"
    assert environment.cache_home({"XDG_CACHE_HOME": str(tmp_path / "c")}) == tmp_path / "c"
    assert environment.cache_home({}) == tmp_path / "home" / ".cache"
