"""Translate with a CTranslate2 export (``attnmt export ctranslate2``, ``attnmt.interop.ctranslate2``).

:class:`CTranslate2Engine` runs the exported model behind attnmt's engine interface
(``attnmt.decode.engine``), with the native search's early-stopping rule, length limits, length
penalties and token log-probabilities (its docstring says how each is obtained); ``attnmt
translate --engine ctranslate2`` and ``attnmt serve --engine ctranslate2`` put it under the same
``Translator``.

This module imports neither PyTorch nor CTranslate2's converters (which load PyTorch and
transformers): a process that translates with the CTranslate2 engine starts as fast as one that
calls CTranslate2 directly. The exporter, which needs both, is ``attnmt.interop.ctranslate2``.

Library: ctranslate2 (``pip install 'attnmt[export]'``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attnmt import rundir
from attnmt.data.tokenizers import EOS_ID, Tokenizer
from attnmt.decode.engine import CORE_OPTIONS, Hypothesis, SearchOptions, check_positions
from attnmt.errors import CheckpointError, ConfigError, OptionError, first_line, library_call
from attnmt.interop.extras import require
from attnmt.names import canonical_name
from attnmt.search.hypothesis import output_length_limits
from attnmt.search.options import check_count

ctranslate2 = require("ctranslate2")


def all_pieces(tokenizer: Tokenizer) -> list[str]:
    """Every piece of ``tokenizer``, in id order (CTranslate2's vocabulary)."""
    return tokenizer.pieces(list(range(len(tokenizer))))


def _device_of(name: str) -> tuple[str, int]:
    """CTranslate2's (device, device_index) for an attnmt device name ('auto', 'cpu', 'cuda',
    'cuda:N'); 'auto' is CUDA when CTranslate2 sees a GPU, else the CPU.

    Raises:
        ConfigError: 'mps' or another name CTranslate2 cannot run on, or CUDA without a GPU.
    """
    gpus = ctranslate2.get_cuda_device_count()
    if name == "auto":
        return ("cuda", 0) if gpus else ("cpu", 0)
    if name == "cpu":
        return "cpu", 0
    if name == "cuda" or name.startswith("cuda:"):
        index = int(name.partition(":")[2] or 0)
        if index >= gpus:
            raise ConfigError(f"device {name}: CTranslate2 sees {gpus} CUDA device(s)")
        return "cuda", index
    raise ConfigError(f"the ctranslate2 engine runs on cpu or cuda[:N], not {name}")


# CTranslate2's compute types; which of them a device runs is its get_supported_compute_types
COMPUTE_TYPES = ("default", "auto", "float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16",
                 "int8_bfloat16", "int16")


def check_device(device: str, compute_type: str = "default") -> tuple[str, int]:
    """CTranslate2's (device, device_index) for ``device`` (:func:`_device_of`), once
    ``compute_type`` is known to run there: what loading the export would find out, checked
    without loading it.

    Raises:
        ConfigError: a device CTranslate2 cannot use here.
        OptionError: an unknown compute type, or one this device has no kernels for (naming
            those it has).
    """
    kind, index = _device_of(device)
    compute_type = canonical_name(compute_type)
    if compute_type not in COMPUTE_TYPES:
        raise OptionError(f"--compute-type {compute_type!r}: not a CTranslate2 compute type; use one of "
                          f"{', '.join(COMPUTE_TYPES)}")
    supported = ctranslate2.get_supported_compute_types(kind, index)
    if compute_type not in ("default", "auto") and compute_type not in supported:
        raise OptionError(f"--compute-type {compute_type}: CTranslate2 on {kind} has no such kernels here; use "
                          f"one of {', '.join(sorted(supported))} (or default)")
    return kind, index


class CTranslate2Engine:
    """An ``attnmt.decode.engine.Engine`` over a CTranslate2 export: CTranslate2 searches, the
    results are made to match the native search (module docstring of ``attnmt.decode.engine``).

    Beam search with early stopping (``SearchOptions.early_stopping``) is CTranslate2's own
    search: the native rule is CTranslate2's (``attnmt.search.beam``), so each batch is one
    ``translate_batch`` call with ``patience``, ``num_hypotheses = round(K x patience)``, no
    minimum length, and no re-scoring (:meth:`_translate_beam`):

    - Length limit: one ``max_decoding_length`` per call, the batch's longest limit M. A
      sentence with a shorter limit L is searched exactly as with its own limit unless its
      search was still going at step L (both searches are the same up to there); then one of
      the ``round(K x patience)`` hypotheses returned is at least L tokens long (fewer than
      that many had finished before step L). Those sentences, and only those, are searched again
      with ``max_decoding_length = L`` (one call per distinct limit). At its limit CTranslate2
      finishes the last step's K best as they are, as the native rule does.
    - Length penalty: CTranslate2 ranks by log P / |Y|^alpha (|Y| with EOS: ``return_end_token``);
      ``average`` is alpha = 1, the native score exactly. For GNMT, log P is recovered from each
      returned score (score x |Y|^alpha) and the hypotheses are ranked by the native
      log P / ((k + |Y|) / (k + 1))^alpha (the same ranking when k = 0). alpha = 0 is passed as
      1e-6: at 0 CTranslate2 switches to another stopping rule (stop when the best candidate ends).
    - Token log-probabilities: forced decoding (``score_batch``) of the ``nbest`` kept
      hypotheses, only when ``return_token_log_probs``; ``log_prob`` and ``score`` never need it.
    - Forbidden ids: ``suppress_sequences``, which CTranslate2 applies before its softmax (the
      others renormalised; the native search sets them to -inf after it); none in attnmt's own
      models.

    Greedy search is one ``translate_batch`` call per batch to the batch's longest limit M
    (:meth:`_translate_greedy`): greedy search takes the same tokens up to step L whatever its
    limit, so a sentence with limit L whose output reached L tokens is cut to them, without EOS,
    as every search ends at its limit (``attnmt.search.beam``); forced decoding scores only those
    (and every output when token log-probabilities are asked for).

    Beam search with exact stopping (``early_stopping`` false) is not CTranslate2's rule, so
    the engine does not declare it (``supports`` lacks 'exact_stopping'): such a request is
    refused before any work with one line naming ``--early-stopping true``
    (``attnmt.decode.engine.check_supported``). Scores and the n-best choice are
    ``SearchOptions.score`` and ``SearchOptions.best``, as in every engine.

    Args:
        export_dir: written by ``attnmt.interop.ctranslate2.export_ctranslate2``.
        device: 'auto', 'cpu', 'cuda' or 'cuda:N' (CTranslate2's CUDA build for a GPU); None: the
            export's ``decode.device``.
        compute_type: CTranslate2's compute type ('default': the stored weights' type).
        threads: intra-op threads, 0 = CTranslate2's default.
        inter_threads: batches CTranslate2 translates at the same time (its ``inter_threads``:
            calls from that many threads run in parallel, each on ``threads`` threads).
    Raises:
        CheckpointError: no model.bin in ``export_dir``, or files CTranslate2 cannot load.
        ConfigError: a device it cannot use. OptionError: a compute type it cannot run there
            (:func:`check_device`).
        ValueError: threads or inter_threads out of range (``attnmt.search.options.check_count``).
    """

    name = "ctranslate2"
    supports = CORE_OPTIONS | {"return_attention"}
    capabilities = frozenset({"score"})
    load_options = frozenset({"compute_type"})

    def __init__(self, export_dir: str | Path, device: str | None = "cpu", compute_type: str = "default",
                 threads: int = 0, inter_threads: int = 1):
        check_count(threads, "threads", low=0)  # CTranslate2's size_t arguments, before its TypeError
        check_count(inter_threads, "inter_threads")
        if not (Path(export_dir) / rundir.CTRANSLATE2_MODEL).is_file():
            raise CheckpointError(f"{export_dir}: no {rundir.CTRANSLATE2_MODEL}; export it with 'attnmt export "
                                  "ctranslate2'")
        self.config = rundir.read_config(export_dir)
        self.src_tokenizer, self.tgt_tokenizer = rundir.read_tokenizers(export_dir)
        compute_type = canonical_name(compute_type)  # 'INT8' names what 'int8' names
        kind, index = check_device(device or self.config.decode.device, compute_type)
        try:
            self.translator = ctranslate2.Translator(str(export_dir), device=kind, device_index=index,
                                                     compute_type=compute_type, inter_threads=inter_threads,
                                                     intra_threads=threads)
        except RuntimeError as e:  # a truncated model.bin, a broken config.json or vocabulary
            raise CheckpointError(f"{Path(export_dir) / rundir.CTRANSLATE2_MODEL}: CTranslate2 cannot load this export "
                                  f"({str(e).splitlines()[0]}); export it again with 'attnmt export ctranslate2'"
                                  ) from None
        self._forbidden = [self.tgt_tokenizer.pieces([i]) for i in self.config.model.forbidden_ids]
        self._src_pieces = all_pieces(self.src_tokenizer)
        self._eos_piece = self.tgt_tokenizer.pieces([EOS_ID])[0]

    @property
    def device(self) -> str:
        return f"{self.translator.device}:{self.translator.device_index}" if self.translator.device == "cuda" else "cpu"

    @property
    def precision(self) -> str:
        """CTranslate2's compute type, e.g. 'float32', 'int8_float32'."""
        return self.translator.compute_type

    def _pieces(self, ids: list[int]) -> list[str]:
        return [self._src_pieces[i] for i in ids]

    def translate(self, sources: list[list[int]], options: SearchOptions) -> list[list[Hypothesis]]:
        """Search ``sources`` (ids ending with EOS) with CTranslate2 (class docstring; the caller
        has refused constraints and streaming). With ``return_attention`` the best hypothesis'
        attention is CTranslate2's: one layer, the export's alignment layer with its heads
        averaged (``attnmt.interop.ctranslate2``), float32 (1, 1, T, S).

        Raises:
            PositionError: a source longer than max_positions, before CTranslate2 sees it.
        """
        check_positions(sources, self.config.model.max_positions, "source")
        limits = output_length_limits([len(s) for s in sources], options.max_len_a, options.max_len_b,
                                      self.config.model.max_positions - 1)
        src_pieces = [self._pieces(s[:-1]) for s in sources]
        if options.is_greedy:
            results = self._translate_greedy(src_pieces, limits, options)
        else:
            results = self._translate_beam(src_pieces, limits, options)
        if options.return_attention and len(sources) > 1:
            self._first_attention_rows(src_pieces, results)
        return results

    def _first_attention_rows(self, src_pieces: list[list[str]], results: list[list[Hypothesis]]) -> None:
        """Replace the first row of each best hypothesis' attention but the batch's first: in a
        batch, CTranslate2 (4.x) returns the first sentence's first-step attention for every
        sentence. The first step is the same whatever the search, so one one-step call per
        sentence gives the right row."""
        for pieces, hyps in list(zip(src_pieces, results))[1:]:
            attention = hyps[0].attention
            if attention is None or not attention.size(2):
                continue
            with _ctranslate2("translate_batch"):
                out = self.translator.translate_batch([pieces], beam_size=1, max_decoding_length=1,
                                                      return_attention=True, max_input_length=0)
            row = _attention(out[0].attention[0], 1)[0, 0, 0]  # (S,), maybe with an EOS column
            attention[0, 0, 0] = row[:attention.size(3)]

    def _translate_greedy(self, src_pieces: list[list[str]], limits: list[int], options: SearchOptions
                          ) -> list[list[Hypothesis]]:
        """Greedy search: one ``translate_batch`` call per batch, to the batch's longest limit
        (class docstring). Greedy search takes the same tokens up to any step whatever its
        limit, so a sentence whose output reaches its own limit L is cut to its first L tokens,
        without EOS, as every search ends at its limit; forced decoding (``score_batch``) gives
        the log P of those sentences only, and of every sentence when ``return_token_log_probs``."""
        eos, longest = self._eos_piece, max(limits)
        with _ctranslate2("translate_batch"):
            out = self.translator.translate_batch(
                src_pieces, beam_size=1, num_hypotheses=1, length_penalty=0.0, max_decoding_length=longest,
                min_decoding_length=0, return_end_token=True, return_scores=True, max_input_length=0,
                suppress_sequences=self._forbidden or None, return_attention=options.return_attention)
        found: list[tuple[list[str], float | None]] = []  # (pieces without EOS, log P if it ended, else None: cut)
        for result, limit in zip(out, limits):
            pieces = result.hypotheses[0]
            ended = pieces[-1:] == [eos] and len(pieces) <= limit
            found.append((pieces[:-1], result.scores[0]) if ended else (pieces[:limit], None))
        todo = [i for i, (_, lp) in enumerate(found) if lp is None or options.return_token_log_probs]
        scored = dict(zip(todo, self._score([src_pieces[i] for i in todo], [found[i][0] for i in todo])))
        results = []
        for i, (pieces, lp) in enumerate(found):
            ids = self.tgt_tokenizer.piece_ids(pieces) + ([EOS_ID] if lp is not None else [])
            lps = scored[i][:len(ids)] if i in scored else []  # score_batch adds EOS to a cut hypothesis
            log_prob = sum(lps) if lp is None else lp
            attention = _attention(out[i].attention[0], len(ids)) if options.return_attention else None
            results.append([Hypothesis(ids, lps if options.return_token_log_probs else [], log_prob,
                                       options.score(log_prob, len(ids)), attention)])
        return results

    def _translate_beam(self, src_pieces: list[list[str]], limits: list[int], options: SearchOptions
                        ) -> list[list[Hypothesis]]:
        """Beam search with early stopping: CTranslate2's own search, one call per batch, plus
        one per distinct limit for the sentences whose limit binds (class docstring)."""
        wanted = options.finished_wanted
        alpha = 1.0 if options.length_penalty_type == "average" else options.length_penalty or 1e-6
        args = dict(beam_size=options.beam_size, patience=options.patience, num_hypotheses=wanted,
                    length_penalty=alpha, min_decoding_length=0, return_end_token=True, return_scores=True,
                    max_input_length=0, suppress_sequences=self._forbidden or None,
                    return_attention=options.return_attention)
        longest = max(limits)
        with _ctranslate2("translate_batch"):
            found = list(self.translator.translate_batch(src_pieces, max_decoding_length=longest, **args))
        again: dict[int, list[int]] = {}  # limit -> sentences whose search reached it
        for i, (result, limit) in enumerate(zip(found, limits)):
            if limit < longest and any(len(h) >= limit for h in result.hypotheses):
                again.setdefault(limit, []).append(i)
        for limit, idx in again.items():
            with _ctranslate2("translate_batch"):
                out = self.translator.translate_batch([src_pieces[i] for i in idx], max_decoding_length=limit, **args)
            for i, result in zip(idx, out):
                found[i] = result
        eos = self._eos_piece
        kept: list[list[tuple[list[str], float, list]]] = []  # per sentence: (pieces, </s> if it ended; log P; attention)
        for result in found:
            attention = result.attention if options.return_attention else [None] * len(result.hypotheses)
            hyps = [(pieces, score * len(pieces) ** alpha, a)
                    for pieces, score, a in zip(result.hypotheses, result.scores, attention)]
            hyps.sort(key=lambda h: options.score(h[1], len(h[0])), reverse=True)
            kept.append(hyps[:options.nbest])
        todo = [(i, j) for i, hyps in enumerate(kept) for j in range(len(hyps))] if options.return_token_log_probs \
            else []
        token_lps = dict(zip(todo, self._score([src_pieces[i] for i, _ in todo],
                                               [_body(kept[i][j][0], eos) for i, j in todo])))
        results: list[list[Hypothesis]] = []
        for i, hyps in enumerate(kept):
            out = []
            for j, (pieces, log_prob, attention) in enumerate(hyps):
                ids = self.tgt_tokenizer.piece_ids(_body(pieces, eos)) + ([EOS_ID] if pieces[-1:] == [eos] else [])
                lps = token_lps.get((i, j), [])[:len(ids)]  # score_batch adds EOS to a hypothesis cut without it
                out.append(Hypothesis(ids, lps, log_prob, options.score(log_prob, len(ids)),
                                      _attention(attention, len(ids)) if attention is not None else None))
            results.append(options.best(out))
        return results

    def forced_log_probs(self, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        """Forced decoding (capability 'score', ``score_batch``): per pair, the natural-log
        probability of each target id, as ``NativeEngine.forced_log_probs`` gives them.

        Args:
            sources: source ids ending with EOS; targets: output ids ending with EOS, pairwise.
        Raises:
            PositionError: a source or target longer than max_positions (the native model's
                message), before CTranslate2 sees it.
        """
        check_positions(sources, self.config.model.max_positions, "source")
        check_positions(targets, self.config.model.max_positions, "target")
        pieces = self.tgt_tokenizer.pieces
        scored = self._score([self._pieces(s[:-1]) for s in sources],
                             [pieces(t[:-1] if t[-1:] == [EOS_ID] else t) for t in targets])
        return [lps[:len(t)] for lps, t in zip(scored, targets)]  # score_batch adds EOS to a target without it

    def _score(self, sources: list[list[str]], targets: list[list[str]]) -> list[list[float]]:
        """Forced decoding: per pair, the natural-log probability of each target piece and of
        the EOS after them."""
        if not targets:
            return []
        with _ctranslate2("score_batch"):
            scored = self.translator.score_batch(sources, targets, max_input_length=0)
        return [list(r.log_probs) for r in scored]


def _attention(rows: list[list[float]], length: int):
    """CTranslate2's attention of one hypothesis (T rows of S source weights) as float32
    (1, 1, T, S), cut to its ``length`` tokens (PyTorch imported only when attention is asked for)."""
    import torch

    return torch.tensor(rows[:length], dtype=torch.float32)[None, None]  # (1, 1, T, S)


@contextmanager
def _ctranslate2(call: str) -> Iterator[None]:
    """The boundary of a call into CTranslate2's translator: its ``RuntimeError`` (a failed
    allocation, a kernel that fails on this machine) becomes ``EnvironmentFailure``; its
    ``ValueError`` (an option it refuses) becomes ``OptionError``, the user's error."""
    try:
        with library_call(f"CTranslate2 ({call})", "translate with --engine native, or export the model again with "
                          "'attnmt export ctranslate2'", RuntimeError):
            yield
    except ValueError as e:
        if isinstance(e, OptionError):
            raise
        raise OptionError(f"CTranslate2 ({call}) refused an option: {first_line(e)}") from e


def _body(pieces: list[str], eos: str) -> list[str]:
    """``pieces`` without a final ``eos``."""
    return pieces[:-1] if pieces[-1:] == [eos] else pieces

