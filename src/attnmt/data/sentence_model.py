"""Where sentences start, learned from the training source lines: spaCy's trainable ``senter``.

A rule-based splitter (sentencex, ``attnmt.documents.sentences``) ends a sentence only at
punctuation. Text without it (Multi30k's captions mostly have no full stop: "Zwei Männer in
einer Stadt Der Mann ...") stays one sentence, which the model then translates badly. The
training corpus says what a sentence is for the model that learns from it: one per line. So
preparation (``attnmt.data.prepare``) also trains spaCy's sentence recognizer (``senter``, a
small CNN over spaCy's rule-based tokens, no download) on paragraphs made by joining the sampled
source lines one to five at a time, and keeps it beside the tokenizers as a folder,
:data:`FOLDER` (also copied into the model directory). On Multi30k's German it takes about
6 seconds on two CPU cores for 29,000 lines and is under 1 MB.

The document layer uses it only where the rules see no punctuation (docs/documents.md gives the
measured accuracy of the rules, the model and both together).

Loading never executes code from the folder: the pipeline is built here (``spacy.blank`` of
the language in its ``meta.json``, read as JSON, and a fresh ``senter``) and only the weights
and vocabulary are read into it (spaCy's ``from_disk``: msgpack and JSON).

Library: spaCy (the ``documents`` extra).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import random
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from attnmt.atomic import swap_directory

log = logging.getLogger(__name__)

FOLDER = "sentences"  # in a prepared data directory and a model directory
MAX_LINES = 50_000  # lines of the sample it learns from at most (about 10 s on two cores)
EPOCHS = 2
BATCH = 64  # texts per batch, in training and in use


def available() -> bool:
    """Whether spaCy is installed (the ``documents`` extra); imports nothing."""
    return importlib.util.find_spec("spacy") is not None


def _spacy():
    """spaCy, imported without PyTorch where PyTorch is not imported yet.

    spaCy's thinc imports PyTorch whenever it is installed (about 150 MiB and a second), though
    the ``senter`` runs on NumPy; preparation and the CTranslate2 and ONNX Runtime engines run
    without PyTorch, so for the import ``import torch`` is made to fail (a None in
    ``sys.modules``, Python's documented way), which thinc takes as PyTorch being absent.
    """
    if "torch" in sys.modules or "spacy" in sys.modules:
        import spacy

        return spacy
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        import spacy
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return spacy


def train(lines: list[str], lang: str | None, seed: int):
    """A ``senter`` pipeline trained on ``lines`` (one sentence each) joined into paragraphs.

    Args:
        lines: source sentences, at most :data:`MAX_LINES` of them are used, in order.
        lang: their language code (spaCy's rule-based tokenizer of it; 'xx' for None or a code
            spaCy lacks).
        seed: fixes the grouping, the order and spaCy's initialisation; the random states of
            ``random`` and NumPy are put back afterwards, and PyTorch's is never touched.
    Returns:
        A ``spacy.Language`` with one component, ``senter``.
    """
    import numpy as np

    spacy = _spacy()
    from spacy.tokens import Doc
    from spacy.training import Example

    states = random.getstate(), np.random.get_state()
    try:  # thinc draws from these two; not spacy.util.fix_random_seed, which reseeds PyTorch's too
        random.seed(seed)
        np.random.seed(seed)
        nlp = _blank(lang)
        nlp.add_pipe("senter")
        rng = random.Random(seed)
        lines = [line for line in lines[:MAX_LINES] if line.strip()]
        examples, i = [], 0
        while i < len(lines):
            group = lines[i:i + rng.randint(1, 5)]
            i += len(group)
            words, starts = [], []
            for sentence in group:
                tokens = [t.text for t in nlp.make_doc(sentence)]
                words += tokens
                starts += [True] + [False] * (len(tokens) - 1)
            if words:
                examples.append(Example(Doc(nlp.vocab, words=words), Doc(nlp.vocab, words=words, sent_starts=starts)))
        optimizer = nlp.initialize(lambda: examples)
        for _ in range(EPOCHS):
            rng.shuffle(examples)
            for batch in spacy.util.minibatch(examples, BATCH):
                nlp.update(batch, sgd=optimizer)
        return nlp
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])


def save(nlp, directory: str | Path) -> None:
    """Write ``nlp`` as ``directory/FOLDER``, replacing one there (:func:`_write_folder`)."""
    _write_folder(directory, nlp.to_disk)


def copy(source_dir: str | Path, output: str | Path) -> bool:
    """Copy ``source_dir/FOLDER`` into ``output`` (the same way as :func:`save`); False where
    ``source_dir`` has none."""
    source = Path(source_dir) / FOLDER
    if not source.is_dir():
        return False
    _write_folder(output, lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True))
    return True


def _write_folder(directory: str | Path, fill: Callable[[Path], object]) -> None:
    """``directory/FOLDER`` filled by ``fill`` in a temporary folder beside it, then renamed
    into place (``attnmt.atomic.swap_directory``): the old folder or the new one, whole."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{FOLDER}.", dir=directory))
    try:
        fill(tmp)
        swap_directory(tmp, Path(directory) / FOLDER)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def starts_of(directory: str | Path) -> Callable[[list[str]], list[list[int]]] | None:
    """The sentence starts the model in ``directory/FOLDER`` finds, as a function of texts: per
    text, the character offsets of every sentence start after the first. None where the folder is missing,
    spaCy is not installed, or the folder does not load (logged). Loaded once per folder as it
    is (a folder written again is loaded again); the function may be called from several
    threads (a lock serialises the model)."""
    folder = Path(directory) / FOLDER
    meta = folder / "meta.json"
    if not meta.is_file() or not available():
        return None
    return _load(str(folder.resolve()), meta.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _load(directory: str, _written: int) -> Callable[[list[str]], list[list[int]]] | None:
    folder = Path(directory)
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        nlp = _blank(meta.get("lang"))
        nlp.add_pipe("senter")
        nlp.from_disk(folder, exclude=["config.cfg"])  # the pipeline is ours; its config is not read
    except Exception as e:  # a damaged or foreign folder: the rules alone, said once
        log.warning("%s: the learned sentence splitter does not load (%s); sentences are split by rules alone",
                    folder, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None
    lock = threading.Lock()

    def starts(texts: list[str]) -> list[list[int]]:
        with lock:  # one document's texts in batches through the CNN (nlp.pipe), not one by one
            docs = list(nlp.pipe(texts, batch_size=BATCH))
        return [[sent.start_char for sent in list(doc.sents)[1:]] for doc in docs]

    return starts


def _blank(lang: str | None):
    spacy = _spacy()
    try:
        return spacy.blank(lang or "xx")
    except (ImportError, KeyError, ValueError):  # spaCy has no rules for this language
        return spacy.blank("xx")
