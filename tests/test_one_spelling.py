"""Codes and names are compared in one canonical form everywhere (attnmt.names): every comparison
of a language code, pair, dataset, split, engine, precision or quantization in src goes through
its functions (walked from the source), every option and configuration key taking such a name
takes it in upper case (walked from the parser and the configuration models), and one thing given
twice in two spellings is refused, not collapsed."""

from __future__ import annotations

import argparse
import ast
import re
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from attnmt import cli
from attnmt.config import Config, config_from_dict
from attnmt.config.section import takes_names
from attnmt.data.testsets import direction, parse_testset
from attnmt.errors import AttnmtError, ConfigError, DataError
from attnmt.names import canonical_name, canonical_pair, known_as, one_spelling_each
from tests.test_hardening import assert_one_line_error, run_cli

SRC = Path(__file__).resolve().parents[1] / "src" / "attnmt"

# identifiers that hold a code or a name, or a collection of them
NAME = re.compile(r"(^|_)(lang|langs|language|languages|pair|pairs|dataset|datasets|testset|split|splits|engine|"
                  r"engines|precision|precisions|quantization|quantizations|compute_type|code|codes|known|targets|"
                  r"sources|DATASETS|ENGINES|PRECISIONS|TRAINING_PRECISIONS|QUANTIZATIONS|INT8_CPU_TYPES)$")
# the functions that give a value its one spelling, or look it up among known ones by it
SPELLERS = {"canonical_name", "canonical_language", "canonical_pair", "known_as", "spelling", "same_language",
            "one_spelling_each"}
# comparisons of two values that attnmt itself spelled (not a user's), each with why it needs no speller
ALLOWED = {
    "data/manifest.py: self.splits.get(name)": "split records named by attnmt ('valid.0'), not by a user",
    "data/staleness.py: corpus.max_pairs != entry.max_pairs": "max_pairs here is a count of pairs, not a pair",
    "data/shards.py: offsets.length != pairs + 1": "pairs here is a count of pairs",
    "data/shards.py: self._count == self.shard_pairs": "shard_pairs is a count of pairs",
    "decode/calibration.py: precision not in models": "the timing step's own models, keyed by the precisions "
                                                      "autoprecision.measure passes it (its CANDIDATES), no user's",
}
# the modules that are the spellers
SPELLER_MODULES = {"names.py", "languages.py"}


def _ident(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, (ast.Subscript, ast.Starred)):
        return _ident(node.value)
    if isinstance(node, ast.BinOp):
        return _ident(node.left)
    return ""


def _spelled(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and _ident(node.func) in SPELLERS


def _respelled_names(function: ast.AST) -> set[str]:
    """Names a function assigns from a speller (``precision = canonical_name(precision)``)."""
    out = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and (_spelled(node.value) or isinstance(node.value, ast.IfExp) and (
                _spelled(node.value.body) or _spelled(node.value.orelse))):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return out


def raw_comparisons(root: Path = SRC) -> list[str]:
    """'module: comparison' of each comparison in src of a code or name that no speller made:
    a membership test against a collection that is not written out, an equality of two values
    (neither a constant), or a ``.get`` lookup by one."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel in SPELLER_MODULES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
            respelled = _respelled_names(function)
            body = function.body if isinstance(function, ast.Module) else [function]
            nodes = [n for stmt in body for n in ast.walk(stmt)]
            if isinstance(function, ast.Module):  # module level: outside any function only
                inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                         for n in ast.walk(f)}
                nodes = [n for n in nodes if id(n) not in inner]
            for node in nodes:
                if isinstance(node, ast.Compare):
                    for op, left, right in zip(node.ops, [node.left, *node.comparators], node.comparators):
                        if isinstance(left, ast.Constant) or isinstance(right, ast.Constant):
                            continue
                        if isinstance(op, (ast.In, ast.NotIn)):
                            if isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                                continue
                        elif not isinstance(op, (ast.Eq, ast.NotEq)):
                            continue
                        if not (NAME.search(_ident(left)) or NAME.search(_ident(right))):
                            continue
                        if _spelled(left) or _spelled(right) or {_ident(left), _ident(right)} & respelled:
                            continue
                        found.append(f"{rel}: {ast.unparse(node)}")
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                        and NAME.search(_ident(node.func.value)) and node.args and not _spelled(node.args[0]) \
                        and not isinstance(node.args[0], ast.Constant):
                    found.append(f"{rel}: {ast.unparse(node)}")
    return sorted(set(found))


def test_every_comparison_of_a_code_or_name_goes_through_the_spellers():
    raw = [site for site in raw_comparisons() if site not in ALLOWED]
    assert not raw, f"compare through attnmt.names (known_as, canonical_*) or languages.spelling: {raw}"


def test_the_allowed_comparisons_are_still_there():
    assert set(ALLOWED) <= set(raw_comparisons()), set(ALLOWED) - set(raw_comparisons())


def test_the_walk_would_find_a_raw_lookup(tmp_path):
    """The walk is not blind: a membership test of a pair in the registry, as the download had, is found."""
    (tmp_path / "probe.py").write_text("def f(pair, spec):\n    return pair not in spec.pairs\n\n\n"
                                       "def g(engine):\n    engine = canonical_name(engine)\n    return engine in ENGINES\n")
    assert raw_comparisons(tmp_path) == ["probe.py: pair not in spec.pairs"]


# ---- every option and key that takes a name or a code takes upper case ------------------------------


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _choice_options() -> list[tuple[str, argparse.Action]]:
    return [(command, action) for command, p in _parsers().items() for action in p._actions
            if action.choices and all(isinstance(c, str) for c in action.choices)]


def test_the_parser_walk_finds_the_named_choices():
    found = {(c, a.dest) for c, a in _choice_options()}
    assert {("translate", "engine"), ("translate", "precision"), ("export", "quantization"), ("export", "format"),
            ("serve", "engine")} <= found, found


@pytest.mark.parametrize("command, action", _choice_options(), ids=[f"{c}.{a.dest}" for c, a in _choice_options()])
def test_every_option_of_names_takes_upper_case(command, action):
    assert action.type is canonical_name, f"{command} {action.option_strings or action.dest}: type=canonical_name"
    for choice in action.choices:
        assert action.type(choice.upper()) == choice


def _named_keys(model: type[BaseModel], prefix: str = "") -> list[tuple[str, typing.Any]]:
    out = []
    for name, field in model.model_fields.items():
        if takes_names(field.annotation):
            out.append((prefix + name, field.annotation))
        for arg in [field.annotation, *typing.get_args(field.annotation)]:
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out += _named_keys(arg, f"{prefix}{name}.")
    return out


def test_the_configuration_walk_finds_the_named_keys():
    names = {n for n, _ in _named_keys(Config)}
    assert {"train.precision", "decode.precision", "decode.attention", "train.optimizer"} <= names, names


@pytest.mark.parametrize("key, annotation", _named_keys(Config), ids=[k for k, _ in _named_keys(Config)])
def test_every_key_of_names_takes_upper_case(key, annotation):
    section, name = key.split(".")
    literal = next(a for a in [annotation, *typing.get_args(annotation)] if typing.get_origin(a) is typing.Literal)
    for value in typing.get_args(literal):
        try:
            config = config_from_dict({section: {name: value.upper()}})
        except ConfigError as e:  # another key's rule (a schedule's own keys): the name itself was taken
            assert name not in str(e).split(":")[-1] or "Input should be" not in str(e), e
            continue
        assert getattr(getattr(config, section), name) == value


@pytest.mark.parametrize("key, upper, canonical", [
    ("dataset", "MULTI30K", "multi30k"), ("test_split", "TEST_2016_FLICKR", "test_2016_flickr"),
    ("valid_split", "VAL", "val"), ("train_split", "Train", "train"), ("pairs", ["DE-EN", "Fr-En"], ["de-en", "fr-en"])])
def test_the_data_names_take_upper_case(key, upper, canonical):
    config = config_from_dict({"data": {"dataset": "multi30k", "pairs": ["de-en", "fr-en"], key: upper}})
    assert getattr(config.data, key) == canonical


def test_max_pairs_takes_upper_case_pairs():
    config = config_from_dict({"data": {"dataset": "multi30k", "pair": "DE-EN", "max_pairs": {"De-En": 3}}})
    assert config.data.pair == "de-en" and config.data.max_pairs == {"de-en": 3}


# ---- two spellings of one thing given twice are refused ----------------------------------------------


@pytest.mark.parametrize("raw, key", [
    ({"data": {"dataset": "multi30k", "pairs": ["de-en", "fr-en"], "max_pairs": {"de-en": 3, "DE-EN": 4}}},
     "data.max_pairs"),
    ({"data": {"dataset": "multi30k", "pairs": ["de-en", "De-En"]}}, "data.pairs"),
    ({"tokenizer": {"target_languages": ["en", "EN"]}}, "tokenizer.target_languages"),
])
def test_two_spellings_of_one_thing_are_refused(raw, key):
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}: names '.*' and '.*', one in two spellings"):
        config_from_dict(raw)


def test_a_models_own_list_may_keep_two_spellings():
    """A saved model (an OPUS-MT import written before) is read as it was trained."""
    config = config_from_dict({"tokenizer": {"target_languages": ["pt_BR", "pt_br"], "language_tag": ">>{}<<"}},
                              saved=True)
    assert config.tokenizer.target_languages == ["pt_BR", "pt_br"]


def test_the_import_keeps_one_spelling_of_a_language():
    from attnmt.interop.marian import target_languages

    assert target_languages([">>pt_br<<", ">>pt_BR<<", ">>fra<<"]) == ["fra", "pt_BR"]
    assert target_languages([">>pt_br<<", ">>fra<<"]) == ["fra", "pt_br"]


def test_the_speller_functions():
    assert known_as("DE-EN", ["en-de", "de-en"], canonical_pair) == "de-en"
    assert known_as("MULTI30K", ["multi30k"]) == "multi30k"
    assert known_as("x", ["multi30k"]) is None
    assert one_spelling_each(["de-en", "fr-en"], "p", canonical_pair) == ["de-en", "fr-en"]
    with pytest.raises(ValueError, match="p names 'de-en' and 'DE-en'"):
        one_spelling_each(["de-en", "DE-en"], "p", canonical_pair)


# ---- the download, --testset and their languages in upper case ---------------------------------------


def test_download_takes_an_upper_case_dataset_and_pair(tmp_path, capsys, monkeypatch):
    from tests.conftest import multi30k_data

    root = multi30k_data()
    if root is None:
        pytest.skip("Multi30k not found: set ATTNMT_DATA")
    monkeypatch.setenv("ATTNMT_MULTI30K_URL", (root / "multi30k").as_uri())
    rc, out, err = run_cli(capsys, "download", "MULTI30K", "--pairs", "DE-EN", "--data-dir", str(tmp_path / "d"))
    assert rc == 0, err
    assert sorted(p.name for p in (tmp_path / "d" / "multi30k").iterdir()) == sorted(
        f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en"))
    rc, _, err = run_cli(capsys, "download", "multi30k", "--pairs", "de-en,DE-EN", "--data-dir", str(tmp_path / "e"))
    assert_one_line_error(rc, err, "'de-en' and 'DE-EN'")
    assert not (tmp_path / "e").exists()


def test_a_testset_name_and_its_languages_take_upper_case():
    assert parse_testset("MULTI30K:TEST_2016_FLICKR") == ("multi30k", "test_2016_flickr")
    assert direction(["de"], ["en", "fr"], "DE", "EN") == ("de", "en")
    assert direction(["pt_br"], ["en"], "PT_BR", None) == ("pt_br", "en")
    with pytest.raises(DataError, match="--tgt-lang cs"):
        direction(["de"], ["en", "fr"], None, "cs")


def test_an_unknown_name_is_still_refused(capsys):
    with pytest.raises(AttnmtError):
        parse_testset("wmt14:test")
    rc, _, err = run_cli(capsys, "translate", "--model", "m", "--engine", "TensorRT")
    assert rc == 2 and "invalid choice: 'tensorrt'" in err
