"""The translator a command's options name: ``--engine`` (native PyTorch, CTranslate2 or ONNX
Runtime, ``attnmt.interop.engines``), the model options, and beam search's stopping rule from
``--early-stopping`` and ``--patience``.
"""

from __future__ import annotations

import argparse


def native_translator(args: argparse.Namespace):
    """The native engine's translator (``attnmt.interop.engines.open_translator``), its device
    and precision checked before the model is loaded (``attnmt.interop.engines.check_device``)."""
    from attnmt.interop.engines import check_device, open_translator

    check_device(args.model, "native", args.device, precision=args.precision)

    return open_translator(args.model, "native", args.device, threads=args.threads or 0, weights=args.weights,
                           precision=args.precision, attention=args.attention,
                           inter_threads=getattr(args, "inter_threads", 1))


def engine_translator(args: argparse.Namespace):
    """The translator of ``--engine``: native (PyTorch), ctranslate2 or onnxruntime; the latter two
    read an export directory (``attnmt export``) given as --model. ``--device`` (default: the
    model's decode.device) applies to every engine; it is checked with the precision or compute
    type before the model is loaded (``attnmt.interop.engines.check_device``)."""
    from attnmt.interop.engines import check_device, check_load_options, open_translator

    engine = getattr(args, "engine", "native")
    check_load_options(engine, {"weights": args.weights, "precision": args.precision, "attention": args.attention,
                                "compute_type": getattr(args, "compute_type", "default")})
    if engine == "native":
        return native_translator(args)
    check_device(args.model, engine, args.device, getattr(args, "compute_type", "default"), args.precision)

    return open_translator(args.model, engine, args.device, threads=args.threads or 0, compute_type=args.compute_type,
                           inter_threads=getattr(args, "inter_threads", 1))


def apply_stopping_options(decode, args: argparse.Namespace):
    """``decode`` (a ``DecodeConfig``) under ``--early-stopping`` / ``--patience``
    (``attnmt.search.options.stopping_rule``).

    Raises:
        ValueError: a patience other than 1 without early stopping (one line, exit 2).
    """
    from attnmt.search.options import SearchOptions, stopping_rule

    early_stopping, patience = stopping_rule(decode, args.early_stopping, args.patience)
    decode = decode.model_copy(update={"early_stopping": early_stopping, "patience": patience})
    SearchOptions.from_config(decode)  # checks the pair
    return decode


def with_stopping_options(tr, args: argparse.Namespace):
    """The translator ``tr`` searching under the command line's stopping rule
    (:func:`apply_stopping_options`)."""
    tr.config.decode = apply_stopping_options(tr.config.decode, args)
    return tr
