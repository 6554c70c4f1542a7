"""Reading parallel text, its error messages, the registry, filtering and token batches."""

from __future__ import annotations

import gzip
import hashlib

import pytest

from attnmt.data.batching import make_batch, token_batches
from attnmt.data.corpus import MULTI30K, dataset_file, dataset_pair_files, encode_corpus
from attnmt.data.text import read_lines, read_parallel
from attnmt.data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from attnmt.errors import DataError


def test_plain_and_gzip(tmp_path):
    (tmp_path / "a.txt").write_text("eins\nzwei\n", encoding="utf-8")
    with gzip.open(tmp_path / "b.gz", "wt", encoding="utf-8") as f:
        f.write("one\ntwo\n")
    assert read_parallel(tmp_path / "a.txt", tmp_path / "b.gz") == (["eins", "zwei"], ["one", "two"])


def test_invalid_utf8_names_file_and_line(tmp_path):
    p = tmp_path / "bad.de"
    p.write_bytes(b"gut\nschlecht \xff\n")
    with pytest.raises(DataError, match=r"bad\.de:2: invalid UTF-8"):
        read_lines(p)


def test_line_count_mismatch_gives_both_counts(tmp_path):
    (tmp_path / "s").write_text("a\nb\nc\n")
    (tmp_path / "t").write_text("a\nb\n")
    with pytest.raises(DataError, match=r"has 3 lines but .* has 2"):
        read_parallel(tmp_path / "s", tmp_path / "t")


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_lines(tmp_path / "nope.txt")


def test_empty_and_overlong_pairs_are_dropped_and_counted():
    split = lambda lines: [[4 + len(w) for w in s.split()] for s in lines]  # noqa: E731
    src = ["a b", "", "a b c d e f", "x"]
    tgt = ["c", "d", "e", ""]
    out = encode_corpus(src, tgt, split, split, max_len=3)
    assert (len(out.src), out.dropped_empty, out.dropped_long) == (1, 2, 1)
    assert out.lengths() == [(3, 2)]


def test_make_batch_specials():
    b = make_batch([[5, 6], [7]], [[8], [9, 10]])
    assert b.src.tolist() == [[5, 6, EOS_ID], [7, EOS_ID, PAD_ID]]
    assert b.tgt_in.tolist() == [[BOS_ID, 8, PAD_ID], [BOS_ID, 9, 10]]
    assert b.tgt_out.tolist() == [[8, EOS_ID, PAD_ID], [9, 10, EOS_ID]]
    assert b.num_tgt_tokens == 5
    # a model whose decoder starts from another id (an imported MarianMT model: its pad token)
    assert make_batch([[5]], [[8, 9]], start_id=PAD_ID).tgt_in.tolist() == [[PAD_ID, 8, 9]]


def test_token_batches_budget_coverage_and_determinism():
    import random

    rng = random.Random(0)
    lengths = [(rng.randint(2, 40), rng.randint(2, 40)) for _ in range(500)]
    batches = token_batches(lengths, 300, seed=1, epoch=0)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(500))
    for b in batches:
        assert len(b) * max(max(lengths[i]) for i in b) <= 300
    assert batches == token_batches(lengths, 300, seed=1, epoch=0)
    assert batches != token_batches(lengths, 300, seed=1, epoch=1)


def test_registry_local_directory_and_env(tmp_path, monkeypatch):
    folder = tmp_path / "multi30k"
    folder.mkdir()
    for lang in ("de", "en"):
        (folder / f"val.{lang}.gz").write_bytes(gzip.compress(b"x\n"))
    src, tgt = dataset_pair_files("multi30k", "de-en", "val", data_dir=tmp_path)
    assert (src.name, tgt.name) == ("val.de.gz", "val.en.gz")
    monkeypatch.setenv("ATTNMT_DATA", str(tmp_path))
    assert dataset_file("multi30k", "val", "en") == folder / "val.en.gz"
    with pytest.raises(DataError, match="no such file"):
        dataset_file("multi30k", "train", "en")
    with pytest.raises(DataError, match="no pair 'de-fr'"):
        dataset_pair_files("multi30k", "de-fr", "val")
    with pytest.raises(DataError, match="no split"):
        dataset_file("multi30k", "test_2099", "en")


def test_registry_checksums_match_local_copy(multi30k_dir):
    for name, digest in MULTI30K.sha256.items():
        path = multi30k_dir / "multi30k" / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, name
