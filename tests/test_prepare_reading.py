"""attnmt prepare's reading: blocks of whole lines however the bytes arrive, gzip of several
members, SHA-256 taken while reading (no second pass), line-aligned chunks with the files'
line counts in the error, and the tokenizer sample's reservoir."""

from __future__ import annotations

import gzip
import hashlib
import random

import numpy as np
import pytest

from attnmt.config import config_from_dict
from attnmt.data import prepare as prepare_module
from attnmt.data import text as blocks
from attnmt.data.manifest import FileRecord
from attnmt.data.prepare import prepare
from attnmt.data.sampling import Reservoir
from attnmt.data.text import HashedReader, line_chunks, pair_chunks, whole_lines
from attnmt.errors import DataError

from .conftest import copy_task_config


def _pieces(data: bytes, rng: random.Random):
    """``data`` cut at random places, as a reader may deliver it."""
    cuts = sorted(rng.sample(range(1, len(data)), min(12, len(data) - 1))) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


@pytest.mark.parametrize("ending", [b"", b"\n"])
def test_chunks_of_whole_lines_however_the_blocks_are_cut(ending):
    rng = random.Random(len(ending))
    lines = [rng.choice([b"", b"a", b"eins zwei", b"x\r", "Stra\u00dfe".encode()]) for _ in range(103)]
    text = b"\n".join(lines) + ending
    for trial in range(5):
        blocks = _pieces(text, rng)
        whole = list(whole_lines(blocks))
        assert b"".join(d for d, _ in whole) == text
        assert all(d[int(e[-1]) - 1: int(e[-1])] == b"\n" or d is whole[-1][0] for d, e in whole)
        assert sum(len(e) for _, e in whole) == 103
        chunks = list(line_chunks(_pieces(text, rng), 10))
        assert [n for _, n in chunks] == [10] * 10 + [3]
        assert b"".join(c for c, _ in chunks) == text
        assert [c.count(b"\n") for c, _ in chunks[:-1]] == [10] * 10


@pytest.mark.parametrize("library", ["zlib", "isal.isal_zlib"])
def test_gzip_of_several_members_is_read_and_hashed_as_stored(tmp_path, monkeypatch, library):
    monkeypatch.setattr(blocks, "inflate_lib", pytest.importorskip(library))  # python-isal where installed, else zlib
    path = tmp_path / "two.gz"
    path.write_bytes(gzip.compress(b"eins\nzwei\n") + gzip.compress(b"drei\n"))
    reader = HashedReader(path)
    assert b"".join(reader.blocks()) == b"eins\nzwei\ndrei\n"
    record = reader.record()
    assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["bytes"] == path.stat().st_size == reader.read_bytes
    path.write_bytes(gzip.compress(b"eins\nzwei\n" * 1000)[:-30])  # cut short
    with pytest.raises(DataError, match=r"two\.gz: corrupt gzip file: the file ends inside a gzip member"):
        list(HashedReader(path).blocks())
    flipped = bytearray(gzip.compress(bytes(range(256)) * 400))
    flipped[len(flipped) // 2] ^= 0xFF
    path.write_bytes(bytes(flipped))
    with pytest.raises(DataError, match="corrupt gzip file"):
        list(HashedReader(path).blocks())
    (tmp_path / "empty").write_bytes(b"")
    assert list(HashedReader(tmp_path / "empty").blocks()) == []
    with pytest.raises(DataError, match="missing: no such file"):
        HashedReader(tmp_path / "missing")


def test_pair_chunks_name_both_line_counts_and_stop_at_a_limit(tmp_path):
    (tmp_path / "a").write_bytes(b"".join(b"%d\n" % i for i in range(25)))
    (tmp_path / "b").write_bytes(b"".join(b"%d\n" % i for i in range(23)))
    with pytest.raises(DataError, match=r"a has 25 lines but .*b has 23: parallel files must be line-aligned"):
        list(pair_chunks(HashedReader(tmp_path / "a"), HashedReader(tmp_path / "b"), 10))
    with pytest.raises(DataError, match=r"b has 23 lines but .*a has 25"):
        list(pair_chunks(HashedReader(tmp_path / "b"), HashedReader(tmp_path / "a"), 10))
    chunks = list(pair_chunks(HashedReader(tmp_path / "a"), HashedReader(tmp_path / "a"), 10, limit=13))
    assert [(c.first, c.lines) for c in chunks] == [(1, 10), (11, 3)]
    assert chunks[1].src == b"10\n11\n12\n"


def _offer(reservoir, lines, rng):
    text = b"".join(line + b"\n" for line in lines)
    for data, ends in whole_lines(_pieces(text, rng)):
        reservoir.add(data, ends)


def test_reservoir_keeps_a_small_stream_whole_and_samples_a_large_one_the_same_way_each_time():
    lines = [b"" if i % 7 == 0 else b"line %d" % i for i in range(100)]
    small = Reservoir(100, seed=1, stream=0)
    _offer(small, lines, random.Random(0))
    assert small.lines() == [line.decode() for line in lines if line]  # whole and in order, no empty line
    samples = []
    for cut in range(3):  # however the blocks fall
        large = Reservoir(30, seed=1, stream=0)
        _offer(large, lines, random.Random(cut))
        samples.append(large.lines())
    assert samples[0] == samples[1] == samples[2] and len(set(samples[0])) == len(samples[0]) <= 30
    other = Reservoir(30, seed=2, stream=0)
    _offer(other, lines, random.Random(0))
    assert other.lines() != samples[0]


def test_reservoir_samples_uniformly():
    """Each of 100 lines lands in a sample of 10 with probability 1/10 (over 3,000 seeds: the
    first, middle and last lines within 4 standard deviations)."""
    lines = [b"%03d" % i for i in range(100)]
    taken = np.zeros(100)
    for seed in range(3000):
        reservoir = Reservoir(10, seed=seed, stream=1)
        _offer(reservoir, lines, random.Random(seed))
        taken[[int(x) for x in reservoir.lines()]] += 1
    assert taken.sum() == 30000
    assert (np.abs(taken[[0, 50, 99]] - 300) < 4 * np.sqrt(3000 * 0.1 * 0.9)).all(), taken[[0, 50, 99]]


def test_the_training_text_is_hashed_while_it_is_read(tmp_path, monkeypatch):
    raw = copy_task_config(tmp_path, max_steps=1)
    read = []
    monkeypatch.setattr(prepare_module, "file_record", lambda path: read.append(path.name) or FileRecord(
        str(path), 0, 0, ""))
    manifest = prepare(config_from_dict(raw), tmp_path / "out", workers=2)
    assert sorted(read) == ["valid.src", "valid.tgt"]  # the training files: no second reading
    for side in ("src", "tgt"):
        record = getattr(manifest.train.corpora[0], side)
        assert record.sha256 == hashlib.sha256((tmp_path / f"train.{side}").read_bytes()).hexdigest()
