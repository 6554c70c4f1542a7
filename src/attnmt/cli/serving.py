"""``attnmt serve``: the HTTP translation API (``attnmt.serve``), its limits given as ``--set
NAME=VALUE`` (``attnmt.serve.settings.ServeSettings``), and the checks that let a mistake end in
one line before the server starts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnmt.cli.options import add_engine_options, add_model_options, add_stopping_options, in_range, range_help
from attnmt.cli.translators import apply_stopping_options, engine_translator, with_stopping_options
from attnmt.errors import AttnmtError
from attnmt.ranges import Range

# the port of `attnmt serve` (0, any free port, is not one: the server would say where it listens)
PORT = Range(1, 65535, integer=True)


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from attnmt.serve.app import create_app
    except ImportError as e:
        raise AttnmtError(f"attnmt serve needs FastAPI, uvicorn and prometheus-client ({e.name} is missing): "
                          "pip install 'attnmt[serve]'") from None
    from pydantic import ValidationError

    from attnmt.rundir import model_languages, read_config
    from attnmt.serve.settings import ServeSettings

    languages = model_languages(args.model)  # a missing or broken model directory: a one-line error first
    _check_engine_files(args)
    apply_stopping_options(read_config(args.model).decode, args)  # a bad --patience: refused before the server starts
    try:
        settings = ServeSettings(**dict(_setting(item) for item in args.set))
    except ValidationError as e:
        first = e.errors()[0]
        raise AttnmtError(f"--set {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    app = create_app(lambda: with_stopping_options(engine_translator(args), args), settings,
                     name=Path(args.model).resolve().name, languages=languages)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning" if args.quiet else "info",
                timeout_keep_alive=settings.keep_alive_s)
    return 0


def _check_engine_files(args: argparse.Namespace) -> None:
    """Before ``serve`` starts: the files its engine will load are there (native: config.yaml,
    the tokenizers and weights it still describes, ``rundir.check_model_dir``; ctranslate2 and
    onnxruntime: the export's model files), and the device, precision and compute type can be
    used on this machine (``attnmt.interop.engines.check_device``), so that a mistake ends in one
    line now rather than in a server answering every request with 500.

    Raises:
        AttnmtError: a file missing or not matching config.yaml, a device or precision this
            machine or engine cannot honour.
    """
    from attnmt import rundir

    from attnmt.interop.engines import check_device, check_load_options

    engine = getattr(args, "engine", "native")
    check_load_options(engine, {"weights": args.weights, "precision": args.precision, "attention": args.attention,
                                "compute_type": getattr(args, "compute_type", "default")})
    if engine == "native":
        rundir.check_model_dir(args.model, args.weights)
    check_device(args.model, engine, args.device, getattr(args, "compute_type", "default"), args.precision)
    if engine == "native":
        return
    export = {"ctranslate2": ("ctranslate2", [rundir.CTRANSLATE2_MODEL]),
              "onnxruntime": ("onnx", [rundir.ONNX_ENCODER, rundir.ONNX_DECODER_STEP])}
    kind, names = export[engine]
    for name in names:
        if not (Path(args.model) / name).is_file():
            raise AttnmtError(f"{Path(args.model) / name}: missing; --engine {engine} serves a directory written by "
                              f"'attnmt export {kind}'")


def _setting(item: str) -> tuple[str, str]:
    """One ``--set NAME=VALUE`` of the server as (name, value), both stripped.

    Raises:
        AttnmtError: no '=' or no name.
    """
    name, eq, value = item.partition("=")
    if not eq or not name:
        raise AttnmtError(f"--set {item!r}: expected NAME=VALUE")
    return name.strip(), value.strip()


def add_serve_parser(sub) -> None:
    p = sub.add_parser("serve", help="an HTTP translation API with dynamic batching, and a page showing attention")
    add_model_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=in_range(PORT), default=8000, help=f"port {range_help(PORT)} (default 8000)")
    # the server's limits, not configuration keys: its own --set (docs/serving.md lists the names)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a server limit, e.g. --set max_wait_ms=10 (docs/serving.md)")
    add_stopping_options(p)
    add_engine_options(p)
    p.set_defaults(func=cmd_serve)
