"""Pretrained word vectors in fastText's ``.vec`` text format, and training them with gensim.

A ``.vec`` file (Bojanowski et al., 2017; the format of fastText's published vectors) is UTF-8
text: a header line ``COUNT DIM``, then one line per word, ``WORD v_1 ... v_DIM``, separated by
spaces. :func:`read_vec` reads it (only the words asked for, to keep memory small), and
:func:`write_vec` writes one. Where no published vectors can be downloaded,
:func:`train_fasttext` trains them on tokenized sentences with gensim's FastText (skip-gram
with character n-grams).

Library: gensim (optional, the ``vectors`` extra) for training.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from attnmt.errors import ConfigError, DataError, library_call


if TYPE_CHECKING:
    import torch


def read_vec(path: str | Path, words: set[str] | None = None) -> dict[str, torch.Tensor]:
    """Read a ``.vec`` file.

    Args:
        words: keep only these words (None: all).
    Returns:
        word -> (DIM,) float32 tensor; the first occurrence of a word wins.
    Raises:
        DataError: a missing file, or a malformed header or line (file and line named).
    """
    import torch  # here, not at the top: ``attnmt prepare`` reads vocabularies (vec_words) without PyTorch

    path = Path(path)
    try:
        f = open(path, encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such vector file") from None
    out: dict[str, torch.Tensor] = {}
    with f:
        header = f.readline().split()
        if len(header) != 2 or not all(x.isdigit() for x in header):
            raise DataError(f"{path}:1: expected a header 'COUNT DIM' of a fastText .vec file")
        dim = int(header[1])
        for number, line in enumerate(f, start=2):
            parts = line.rstrip("\n").rstrip(" ").split(" ")
            if len(parts) != dim + 1:
                raise DataError(f"{path}:{number}: expected a word and {dim} numbers, found {len(parts) - 1} fields")
            if parts[0] in out or (words is not None and parts[0] not in words):
                continue
            try:
                out[parts[0]] = torch.tensor([float(x) for x in parts[1:]], dtype=torch.float32)
            except ValueError:
                raise DataError(f"{path}:{number}: not a number in the vector of {parts[0]!r}") from None
    return out


def vec_words(path: str | Path) -> set[str]:
    """The words of a ``.vec`` file, without reading the numbers. Raises DataError if missing."""
    try:
        with open(path, encoding="utf-8") as f:
            f.readline()
            return {line.split(" ", 1)[0] for line in f if line.strip()}
    except FileNotFoundError:
        raise DataError(f"{path}: no such vector file") from None


def write_vec(path: str | Path, vectors: dict[str, list[float]]) -> None:
    """Write word -> vector (all of one length) as a ``.vec`` file (6 decimals)."""
    dim = len(next(iter(vectors.values()))) if vectors else 0
    lines = [f"{len(vectors)} {dim}\n"] + [
        word + " " + " ".join(f"{x:.6f}" for x in vec) + "\n" for word, vec in vectors.items()]
    Path(path).write_text("".join(lines), encoding="utf-8")


def train_fasttext(sentences: list[list[str]], dim: int = 300, epochs: int = 5, min_count: int = 1,
                   seed: int = 1, threads: int = 2) -> dict[str, list[float]]:
    """Train fastText vectors (skip-gram, window 5, character 3-6-grams hashed into 200,000
    buckets) on tokenized sentences
    with gensim; returns word -> vector for the words seen ``min_count`` times.

    Raises:
        ConfigError: gensim is not installed (``pip install 'attnmt[vectors]'``).
        EnvironmentFailure: gensim raised while training.
    """
    try:
        from gensim.models import FastText
    except ImportError:
        raise ConfigError("training vectors needs gensim: pip install 'attnmt[vectors]'") from None
    # 200,000 hash buckets for the n-grams instead of gensim's 2 million: 1/10 of the memory
    # (2.4 GB for 300 dimensions), plenty for a corpus of tens of thousands of words.
    with library_call("gensim's FastText training", "check the corpus and the options (--min-count), or train "
                      "without pretrained vectors", RuntimeError):
        model = FastText(vector_size=dim, window=5, min_count=min_count, sg=1, seed=seed, workers=threads,
                         bucket=200_000)
        model.build_vocab(corpus_iterable=sentences)
        model.train(corpus_iterable=sentences, total_examples=len(sentences), epochs=epochs)
    return {w: model.wv[w].tolist() for w in model.wv.index_to_key}
