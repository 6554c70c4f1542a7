"""What bounds the web page's speed: float32 matrix products in WebAssembly against native code.

The page (``attnmt export web``) runs its graphs with ONNX Runtime Web's WebAssembly backend, whose
matrix products use 128-bit SIMD; native PyTorch and ONNX Runtime use the CPU's AVX2 or AVX-512.
A beam search over a small Transformer spends most of its time in such products, so the page's
speed relative to native (issue 39 asks >= 50% on one thread) is bounded by this ratio.

Each shape is one ``MatMul`` (rows x d_in) @ (d_in x d_out) as a one-node ONNX graph (the
``onnx`` package), timed on ``--threads`` threads (best of ``--rounds`` rounds of ``--runs``
runs each) by:

- ``onnxruntime-web wasm``: the page's own onnxruntime-web (``src/attnmt/web/node_modules``, as
  ``npm ci`` installs it) in Node, whose WebAssembly engine is V8's, Chromium's;
- ``PyTorch``: ``torch.nn.functional.linear``, what the native engine calls;
- ``ONNX Runtime``: the native CPU build (``onnxruntime``), the ONNX engine's.

The default shapes are the de-en preset's decoder products: the output projection (256 ->
8,000), the feed-forward layers (256 -> 1,024 -> 256) and an attention projection (256 -> 256),
each at ``--rows-native`` rows (128 sentences x beam 5, as ``attnmt translate`` batches) and at
``--rows-page`` rows (32 sentences x beam 5, the batched page's).

With ``--model RUN_DIR --data DIR``, also the native side of the bound: a beam search of
test_2016_flickr through ``Translator.translate_ids`` on the same threads (the model's decode
settings, batches of 128), timed plainly and then under ``torch.profiler``, whose ``aten::addmm``
and ``aten::mm`` self times are its products with weight matrices (the shapes above) and
``aten::bmm`` its attention products. At WebAssembly's rate the weight products alone take at
least their native seconds x the smallest ratio of PyTorch's rate (native rows) to WebAssembly's
(page rows) over the shapes; counting the attention products at native speed, the page's share of
native speed is at most the native search's seconds over that sum.

Prints a Markdown table and one JSON object; figures go to RESULTS.md only from an otherwise idle
machine, with its CPU named.

Usage (from the repository root, after ``cd src/attnmt/web && npm ci``):
    .venv/bin/python benchmarks/web_gemm.py --model runs/de-en --data "$ATTNMT_DATA"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from benchmarks.decode_profile import fastest, profile_search  # noqa: E402
from benchmarks.presets import machine  # noqa: E402

ORT_WEB = HERE.parent / "src/attnmt/web/node_modules/onnxruntime-web/dist/ort.wasm.min.mjs"
SHAPES = ((256, 8000), (256, 1024), (1024, 256), (256, 256))  # (d_in, d_out) of the de-en preset's decoder

# Node side: times every graph as the page runs its graphs (wasm backend, graph optimisation
# "all"), prints {"name": seconds per run} as JSON.
NODE_SCRIPT = """
import * as ort from %(ort)s;
import { readFileSync } from "fs";
const [threads, runs, rounds, ...files] = process.argv.slice(2);
ort.env.wasm.numThreads = Number(threads);
const out = {};
for (const f of files) {
  const session = await ort.InferenceSession.create(readFileSync(f), { executionProviders: ["wasm"],
                                                                       graphOptimizationLevel: "all" });
  const [rows, dIn] = JSON.parse(readFileSync(f + ".json", "utf8"));
  const x = new ort.Tensor("float32", Float32Array.from({ length: rows * dIn }, () => Math.random() - 0.5), [rows, dIn]);
  for (let i = 0; i < 3; i++) await session.run({ x });
  let best = Infinity;
  for (let r = 0; r < Number(rounds); r++) {
    const t = performance.now();
    for (let i = 0; i < Number(runs); i++) await session.run({ x });
    best = Math.min(best, (performance.now() - t) / 1000 / Number(runs));
  }
  out[f] = best;
}
console.log(JSON.stringify(out));
"""


def _graph(path: Path, rows: int, d_in: int, d_out: int) -> None:
    """A one-node ONNX graph y = x W, x (rows, d_in) float32, W (d_in, d_out) a random initializer."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((d_in, d_out), dtype=np.float32), "W")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "matmul",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, d_in])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, d_out])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # an IR version every onnxruntime release reads
    onnx.save(model, str(path))
    path.with_name(path.name + ".json").write_text(json.dumps([rows, d_in]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="threads of every engine (the page's default: 1)")
    ap.add_argument("--runs", type=int, default=20, help="products per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per shape and engine (fastest kept)")
    ap.add_argument("--shapes", nargs="+", metavar="INxOUT", help="d_in x d_out of each product, e.g. 256x8000 "
                    "(default: the de-en preset's decoder products)")
    ap.add_argument("--rows-native", type=int, default=640, help="rows of a native product (128 sentences x beam 5)")
    ap.add_argument("--rows-page", type=int, default=160, help="rows of a page product (32 sentences x beam 5)")
    ap.add_argument("--model", type=Path, help="a de-en model directory: also profile its native beam search")
    ap.add_argument("--data", type=Path, help="the directory holding multi30k/ (with --model)")
    ap.add_argument("--beam", type=int, help="beam size of that search (default: the model's)")
    args = ap.parse_args()
    if not ORT_WEB.is_file():
        sys.exit(f"{ORT_WEB} is missing: run `npm ci` in src/attnmt/web first")
    if (args.model is None) != (args.data is None):
        sys.exit("--model and --data go together")
    dims = [tuple(int(v) for v in s.split("x")) for s in args.shapes] if args.shapes else list(SHAPES)
    shapes = sorted({(rows, d_in, d_out) for rows in (args.rows_native, args.rows_page) for d_in, d_out in dims},
                    key=lambda s: (-s[0], dims.index(s[1:])))
    torch.set_num_threads(args.threads)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = args.threads
    rows_out = []
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for rows, d_in, d_out in shapes:
            path = Path(tmp) / f"matmul_{rows}_{d_in}_{d_out}.onnx"
            _graph(path, rows, d_in, d_out)
            files.append(path)
        script = Path(tmp) / "bench.mjs"
        script.write_text(NODE_SCRIPT % {"ort": json.dumps(str(ORT_WEB))})
        node = subprocess.run(["node", str(script), str(args.threads), str(args.runs), str(args.rounds),
                               *map(str, files)], capture_output=True, text=True, check=True)
        wasm = json.loads(node.stdout.strip().splitlines()[-1])
        for (rows, d_in, d_out), path in zip(shapes, files):
            x = torch.randn(rows, d_in)
            w = torch.randn(d_out, d_in)
            session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            feed = {"x": x.numpy()}
            flops = 2 * rows * d_in * d_out
            gflops = {"wasm": flops / wasm[str(path)] / 1e9,
                      "torch": flops / fastest(lambda: F.linear(x, w), args.runs, args.rounds, warmup=3) / 1e9,
                      "onnxruntime": flops / fastest(lambda: session.run(None, feed), args.runs, args.rounds,
                                                     warmup=3) / 1e9}
            rows_out.append({"shape": [rows, d_in, d_out], "gflops": gflops})
    rate = {tuple(r["shape"]): r["gflops"] for r in rows_out}
    # How many times longer a product takes in the page than natively: PyTorch at native rows
    # against WebAssembly at page rows; the smallest over the shapes favours the page.
    slowdown = min(rate[(args.rows_native, *d)]["torch"] / rate[(args.rows_page, *d)]["wasm"] for d in dims)
    result = {"machine": machine(), "threads": args.threads, "node": subprocess.run(
        ["node", "--version"], capture_output=True, text=True).stdout.strip(), "rows": rows_out,
        "min_slowdown": slowdown}
    print(f"float32 matrix products, {args.threads} thread(s), {result['machine']}\n")
    print("| rows x d_in x d_out | onnxruntime-web wasm GFLOP/s | PyTorch GFLOP/s | ONNX Runtime GFLOP/s "
          "| wasm / PyTorch |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows_out:
        g = r["gflops"]
        print(f"| {'x'.join(map(str, r['shape']))} | {g['wasm']:.1f} | {g['torch']:.1f} | {g['onnxruntime']:.1f} "
              f"| {g['wasm'] / g['torch']:.0%} |")
    print(f"\nA product takes at least {slowdown:.2f}x as long in the page ({args.rows_page} rows) as natively "
          f"({args.rows_native} rows).")
    if args.model is not None:
        native = profile_search(args.model, args.data, args.beam, args.threads)
        weights, attention = native["weight_matmul_seconds"], native["attention_matmul_seconds"]
        floor = weights * slowdown + attention  # the page's seconds for the products alone, at least
        native.update(page_floor_seconds=floor, page_bound=native["seconds"] / floor)
        result["native"] = native
        print(f"Native beam {native['beam']} on {native['sentences']} sentences: {native['seconds']:.2f} s, of which "
              f"products with weights {weights:.2f} s and attention products {attention:.2f} s (profiled; "
              f"{(weights + attention) / native['seconds']:.0%} together). In the page these take at least "
              f"{floor:.1f} s: it reaches at most {native['page_bound']:.0%} of native.")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
