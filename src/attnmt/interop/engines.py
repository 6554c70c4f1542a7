"""One factory for every engine: a model directory (or an export of one) in, a ``Translator`` out.

``attnmt translate / evaluate / score / serve --engine`` and Python callers get their engine here:

- ``native``: a model directory (``attnmt train`` or ``attnmt import``) searched by the PyTorch
  model (``attnmt.decode.native.NativeEngine``).
- ``ctranslate2``: a directory from ``attnmt export ctranslate2``
  (``attnmt.interop.ctranslate2_engine.CTranslate2Engine``).
- ``onnxruntime``: a directory from ``attnmt export onnx`` (``attnmt.interop.onnx.OnnxEngine``).

Every export directory holds config.yaml and the tokenizers, so the same ``Translator``
(``attnmt.decode.translator``) tokenises, batches and formats above each engine.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from attnmt.config import canonical_name
from attnmt.decode.engine import UnsupportedOption
from attnmt.decode.translator import Translator
from attnmt.errors import AttnmtError, OptionError
from attnmt.search.options import check_count

ENGINES = ("native", "ctranslate2", "onnxruntime")

# Each engine's class: (module, name). Its ``load_options`` declare the loading choices it takes.
_CLASSES = {"native": ("attnmt.decode.native", "NativeEngine"),
            "ctranslate2": ("attnmt.interop.ctranslate2_engine", "CTranslate2Engine"),
            "onnxruntime": ("attnmt.interop.onnx", "OnnxEngine")}


def engine_class(engine: str) -> type:
    """The engine class of ``engine`` (one of :data:`ENGINES`), imported now.

    Raises:
        AttnmtError: the engine's library is not installed (the ``export`` extra).
    """
    module, name = _CLASSES[engine]
    return getattr(importlib.import_module(module), name)


def check_load_options(engine: str, given: dict[str, object]) -> None:
    """Refuse the loading choices of ``given`` (name -> value; None, False or 'default' is not
    given) that ``engine``'s class does not declare in its ``load_options``.

    Raises:
        UnsupportedOption: one line naming each choice refused (as its command-line flag) and
            the engines that declare it.
        AttnmtError: the engine's library is not installed.
    """
    declared = engine_class(engine).load_options
    refused = sorted(n for n, v in given.items() if v not in (None, False, "default") and n not in declared)
    if not refused:
        return
    owners = set()
    for other in ENGINES:
        try:
            if set(refused) & engine_class(other).load_options:
                owners.add(other)
        except AttnmtError:  # another engine's library is not installed
            continue
    flags = ", ".join(f"{n} (--{n.replace('_', '-')})" for n in refused)
    raise UnsupportedOption(f"the {engine} engine does not support {flags}"
                            + (f": the {' and '.join(sorted(owners))} engine has it" if owners else ""))


def check_device(model_dir: str | Path, engine: str = "native", device: str | None = None,
                 compute_type: str = "default", precision: str | None = None) -> str:
    """Check, without loading a model, that ``engine`` can run ``model_dir`` on ``device`` at
    ``precision`` (native) or ``compute_type`` (ctranslate2): the device is on this machine and
    the engine's library reaches it, and the precision runs there. What a server checks before
    it says it is ready (a model that cannot load would answer every request with 500), and
    every command before its first work. Returns the device's name as the engine means it.

    Args:
        device: as :func:`open_translator`'s (None: the directory's ``decode.device``).
        precision: native only ('int8' runs on the CPU only); None: the directory's
            ``decode.precision``.
    Raises:
        ConfigError: a device this machine or the engine's library does not have.
        OptionError: an unknown engine; a precision or compute type the device cannot run.
        CheckpointError: no readable config.yaml in ``model_dir``.
        AttnmtError: the engine's library is not installed.
    """
    from attnmt import rundir

    engine = canonical_name(engine)
    compute_type = canonical_name(compute_type)
    precision = canonical_name(precision) if precision else precision
    if engine not in ENGINES:
        raise OptionError(f"unknown engine {engine!r}; use {', '.join(ENGINES)}")
    config = rundir.read_config(model_dir)
    name = device or config.decode.device
    if engine == "native":
        from attnmt.device import resolve_device

        resolved = resolve_device(name)
        if (precision or config.decode.precision) == "int8" and resolved.type != "cpu":
            raise OptionError(f"precision int8 (dynamic quantisation) runs on the CPU only, not on {resolved}; "
                              "use --device cpu or --precision fp32")
        return str(resolved)
    if engine == "ctranslate2":
        from attnmt.interop.ctranslate2_engine import check_device as ctranslate2_device

        kind, index = ctranslate2_device(name, compute_type)
        return f"cuda:{index}" if kind == "cuda" else "cpu"
    from attnmt.interop.extras import require
    from attnmt.interop.onnx import _providers

    return _providers(require("onnxruntime"), name)[1]


def open_translator(model_dir: str | Path, engine: str = "native", device: str | None = None, threads: int = 0,
                    compute_type: str = "default", weights: str | Path | None = None, precision: str | None = None,
                    attention: str | None = None, inter_threads: int = 1) -> Translator:
    """A translator over ``engine`` for ``model_dir``.

    Args:
        model_dir: a model directory (native) or an export directory (the other engines).
        engine: one of :data:`ENGINES`.
        device: 'auto', 'cpu', 'cuda', 'cuda:N' ('mps': native only); default the directory's
            ``decode.device``.
        threads: intra-op CPU threads per batch, 0 = the library's default (for native,
            PyTorch's process-wide ``torch.set_num_threads``), or with ``inter_threads`` > 1 this
            machine's cores shared out (at least 1 each).
        inter_threads: batches translated at the same time (``Translator.inter_threads``;
            CTranslate2's ``inter_threads``, Marian's CPU workers). On a small CPU, 2 batches of
            1 thread each translate faster than 1 batch of 2 threads (benchmarks/RESULTS.md).
        compute_type: ctranslate2 only: CTranslate2's compute type ('default': the stored weights').
        weights, precision, attention: native only: another safetensors file, 'fp32' / 'bf16' /
            'int8' / 'auto', and the attention kernel 'explicit' / 'fused' (default: the config's).
    Raises:
        ValueError: an unknown engine, or threads or inter_threads not a whole number that the
            engine's library takes (``attnmt.search.options.check_count``: at most C_INT_MAX;
            threads from 0, inter_threads from 1), before anything is loaded.
        UnsupportedOption: weights, precision, attention or compute_type for an engine whose class
            does not declare them in its ``load_options`` (:func:`check_load_options`).
        CheckpointError, ConfigError: a missing or incomplete directory, or a device this machine
            (or this engine) cannot use.
        AttnmtError: the engine's library is not installed (the ``export`` extra).
    """
    engine = canonical_name(engine)
    if engine not in ENGINES:
        raise OptionError(f"unknown engine {engine!r}; use {', '.join(ENGINES)}")
    check_count(inter_threads, "inter_threads")
    check_count(threads, "threads", low=0)
    if inter_threads > 1 and not threads:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = max(1, cpus // inter_threads)
    check_load_options(engine, {"weights": weights, "precision": precision, "attention": attention,
                                "compute_type": compute_type})
    if engine == "native":
        import torch

        if threads:
            torch.set_num_threads(threads)
        tr = Translator.from_dir(model_dir, weights=weights, device=device, precision=precision)
        if attention:
            tr.set_attention(attention)
        tr.inter_threads = inter_threads
        return tr
    if engine == "ctranslate2":
        from attnmt.interop.ctranslate2_engine import CTranslate2Engine

        search = CTranslate2Engine(model_dir, device, compute_type=compute_type, threads=threads,
                                   inter_threads=inter_threads)
    else:
        from attnmt.interop.onnx import OnnxEngine

        search = OnnxEngine(model_dir, device, threads=threads)
    tr = Translator(search, search.src_tokenizer, search.tgt_tokenizer, search.config)
    tr.inter_threads = inter_threads
    tr.directory = Path(model_dir)
    return tr
