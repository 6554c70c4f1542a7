"""Rules about where the data concepts live in src/attnmt (read from the source, not counted):
the line-alignment error is raised in one function, the manifest is read through its dataclass,
and the text files are opened by one reader."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from attnmt.data.manifest import Manifest
from attnmt.data.text import HashedReader, check_aligned, iter_pairs, pair_chunks, read_parallel
from attnmt.errors import DataError

SRC = Path(__file__).resolve().parents[1] / "src" / "attnmt"
MODULES = sorted(SRC.rglob("*.py"))


def _strings(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """Every string literal (f-string parts included) with its node."""
    return [(node, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_the_line_alignment_error_is_raised_in_one_place():
    places = []
    for path in MODULES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and "must be line-aligned" in ast.unparse(node):
                places.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert places == [f"data/text.py:{_line_of_raise(check_aligned)}"], places


def _line_of_raise(function) -> int:
    source = Path(function.__code__.co_filename).read_text(encoding="utf-8")
    tree = ast.parse(source)
    [defined] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function.__name__]
    [raised] = [n for n in ast.walk(defined) if isinstance(n, ast.Raise)]
    return raised.lineno


def test_the_manifest_is_read_through_its_dataclass_only():
    """No module but data/manifest.py subscripts a ``manifest`` with a string, calls
    ``manifest.get``, or parses manifest.json itself."""
    found = []
    for path in MODULES:
        if path == SRC / "data" / "manifest.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            target = None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                target = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                target = node.func.value
            if target is not None and "manifest" in ast.unparse(target).lower():
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
        for node, value in _strings(tree):
            if value == "manifest.json" and path.name != "distill.py":  # distill's own record, another file
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: names manifest.json")
    assert found == []


def test_text_files_are_opened_by_one_reader():
    """gzip is inflated in data/text.py only (download.py checks the magic bytes of a download)."""
    found = []
    for path in MODULES:
        if path in (SRC / "data" / "text.py",):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if "gzip" in names or "zlib" in names:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert found == []


@pytest.mark.parametrize("reader", ["iter_pairs", "read_parallel", "pair_chunks"])
@pytest.mark.parametrize("lines", [(3, 2), (2, 3), (4000, 4001), (4001, 4000), (0, 1)])
def test_every_reader_of_two_files_refuses_different_line_counts_with_the_one_error(tmp_path, reader, lines):
    """A target one line longer or shorter, at a chunk boundary too (4,000 lines: a chunk of
    ``pair_chunks``), names both files and their counts."""
    src = tmp_path / "a.src"
    tgt = tmp_path / "a.tgt"
    src.write_text("".join(f"s{i}\n" for i in range(lines[0])))
    tgt.write_text("".join(f"t{i}\n" for i in range(lines[1])))
    with pytest.raises(DataError) as e:
        if reader == "iter_pairs":
            list(iter_pairs(src, tgt))
        elif reader == "read_parallel":
            read_parallel(src, tgt)
        else:
            list(pair_chunks(HashedReader(src), HashedReader(tgt), 4000))
    assert str(e.value) == (f"{src} has {lines[0]} lines but {tgt} has {lines[1]}: parallel files must be "
                            "line-aligned")


def test_a_manifest_loads_and_saves_to_the_same_bytes(tmp_path):
    """A prepared directory's manifest.json (several validation sets: valid_sets written after
    valid.0) round-trips byte for byte through the dataclass."""
    record = {"path": "/x", "bytes": 3, "mtime_ns": 5, "sha256": "ab"}
    split = {"shards": [{"name": "valid.0.00000", "pairs": 2}], "lines": 2, "pairs": 2,
             "dropped": {"empty": 0}, "src": record, "tgt": record}
    data = {"format": "attnmt-prepared-1", "token_dtype": "uint16", "tokenizers": {"spm.model": "cd"},
            "filters": {"max_len": 100}, "config": {"data": {}, "tokenizer": {}},
            "train": {"lines": 4, "pairs": 4, "dropped": {"empty": 0}, "shards": [],
                      "corpora": [{"name": "c", "weight": 1.0, "start": 0, "lines": 4, "pairs": 4,
                                   "dropped": {"empty": 0}, "src": record, "tgt": record, "src_lang": None,
                                   "tgt_lang": "en", "max_pairs": 4}]},
            "valid": None, "valid.0": split,
            "valid_sets": [{"name": "de-en", "split": "valid.0", "src_lang": "de", "tgt_lang": "en"},
                           {"name": "fr-en", "split": "valid.1", "src_lang": "fr", "tgt_lang": "en"}],
            "valid.1": split, "fingerprint": "ef", "seconds": 1.5, "seconds_tokenizers": 0.5}
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    (tmp_path / "manifest.json").write_text(text, encoding="utf-8")
    manifest = Manifest.load(tmp_path)
    assert manifest.train.corpora[0].tagged and manifest.train.corpora[0].max_pairs == 4
    assert manifest.split("valid.1").src.sha256 == "ab" and [v.split for v in manifest.valid_sets] == ["valid.0",
                                                                                                      "valid.1"]
    out = tmp_path / "out"
    out.mkdir()
    manifest.save(out)
    assert (out / "manifest.json").read_text(encoding="utf-8") == text
    assert list(out.iterdir()) == [out / "manifest.json"]  # no temporary file left


def test_a_manifest_missing_a_key_is_a_data_error_naming_the_file(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "attnmt-prepared-1", "token_dtype": "uint16"}))
    with pytest.raises(DataError, match=r"manifest\.json: not a manifest of format attnmt-prepared-1 \(missing"):
        Manifest.load(tmp_path)
