"""The commands that cross to other toolkits: ``import`` (a Hugging Face MarianMT model as an
attnmt model directory) and ``export`` (CTranslate2, ONNX graphs, or a static web page;
``attnmt.interop``).
"""

from __future__ import annotations

import argparse

from attnmt.cli.options import check_output_dir
from attnmt.errors import AttnmtError
from attnmt.names import canonical_name


def cmd_import(args: argparse.Namespace) -> int:
    from attnmt.interop.marian import import_marian

    check_output_dir(args.output, "--output")
    import_marian(args.source, args.output)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    check_output_dir(args.output, "--output")
    if args.format == "web":
        if args.quantization not in (None, "int8", "float32") or args.int8_weight_bits is not None:
            raise AttnmtError("web export: --quantization is int8 or float32; --int8-weight-bits applies to the "
                              "ctranslate2 export only")
        from attnmt.interop.web import export_web

        export_web(args.model, args.output, args.quantization)
    elif args.format == "ctranslate2":
        from attnmt.interop.ctranslate2 import export_ctranslate2

        export_ctranslate2(args.model, args.output, args.quantization, args.int8_weight_bits)
    else:
        if args.quantization or args.int8_weight_bits is not None:
            raise AttnmtError("--quantization and --int8-weight-bits apply to the ctranslate2 export only")
        from attnmt.interop.onnx import export_onnx

        export_onnx(args.model, args.output)
    return 0


def add_import_parser(sub) -> None:
    p = sub.add_parser("import", help="import another toolkit's model as an attnmt model directory")
    p.add_argument("kind", type=canonical_name, choices=["marian"], help="marian: a Hugging Face MarianMT (OPUS-MT) model")
    p.add_argument("source", help="a local MarianMT directory, or a Hub id such as Helsinki-NLP/opus-mt-de-en")
    p.add_argument("--output", required=True, help="model directory to create")
    p.set_defaults(func=cmd_import)


def add_export_parser(sub) -> None:
    p = sub.add_parser("export", help="export a model directory for a fast inference engine")
    p.add_argument("format", type=canonical_name, choices=["ctranslate2", "onnx", "web"],
                   help="CTranslate2 model, ONNX graphs, or a static web page translating in the browser")
    p.add_argument("--model", required=True, help="model directory (from 'attnmt train' or 'attnmt import')")
    p.add_argument("--output", required=True, help="directory to create")
    p.add_argument("--quantization", type=canonical_name, choices=["int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16",
                                               "float16", "bfloat16", "float32"],
                   help="ctranslate2: weight type (default float32); web: int8 or float32 (default float32)")
    p.add_argument("--int8-weight-bits", type=int, choices=[7, 8], default=None,
                   help="ctranslate2, int8 / int8_float32 only: 7 avoids the 16-bit saturation of int8 kernels on CPUs "
                        "without VNNI; 8 is CTranslate2's own quantizer (default 7; refused with other quantizations)")
    p.set_defaults(func=cmd_export)
