"""The web page's decoder-step graph: :mod:`attnmt.interop.onnx`'s decoder step with the rows of
its caches chosen inside the graph, so that the page's search never copies a cache in JavaScript.

Between two beam steps the search keeps some hypotheses and drops others (``reorder``). The
Python engines gather their caches with ``index_select``; in the browser a gather of every
layer's keys and values written in JavaScript costs a copy per layer per step. Here the graph
takes the previous step's caches as they came out of ONNX Runtime plus two small index inputs,
and gathers the rows itself (ONNX ``Gather`` on axis 0, before the graph's own nodes):

- ``parent`` (B,) int64: for each of the B rows of this step, the row of the previous step's
  ``self_key_l``, ``self_value_l`` (P, H, t, Dh) float32 it extends (P rows, any number);
- ``sentence`` (n,) int64: the sentences of this step's rows, in row order, among the N of
  ``src_mask`` (N, S) bool and ``src_key_l``, ``src_value_l`` (N, H, S, Dh) float32 (the source
  side of every sentence of the batch, given once). The B rows are n groups of K = B / n
  consecutive rows, one group per sentence (its hypotheses), which attend to their sentence's
  one source row together, as the exported graph and the native model do; as sentences finish,
  ``sentence`` shrinks and the source inputs stay as they are.

Everything else (``tokens`` (B, 1), ``position`` (1,), the outputs ``log_probs`` (B, V),
``new_self_key_l``, ``new_self_value_l`` (B, H, t + 1, Dh), ``attention`` (B, L, S)) is the graph
of :func:`attnmt.interop.onnx.export_onnx` unchanged, so the arithmetic is the same.

Shapes: B rows of this step, P rows of the previous step, N sentences of the batch, n of this
step, S source length, t target positions so far, H heads, Dh head size, L decoder layers, V
vocabulary.

Library: onnx (graph editing and checking).
"""

from __future__ import annotations

from pathlib import Path

from attnmt.interop.extras import require

PARENT, SENTENCE = "parent", "sentence"


def gather_rows_in_graph(path: str | Path) -> None:
    """Rewrite the decoder-step graph at ``path`` in place as the module docstring describes.

    Raises:
        ValueError: the graph has no ``self_*`` / ``src_*`` inputs (not a decoder step of
            :func:`attnmt.interop.onnx.export_onnx`), or already has the index inputs.
    """
    onnx = require("onnx")
    from onnx import TensorProto, helper

    model = onnx.load(str(path))
    graph = model.graph
    names = [i.name for i in graph.input]
    if PARENT in names or SENTENCE in names:
        raise ValueError(f"{path}: the graph already has {PARENT!r} / {SENTENCE!r} inputs")
    index_of = {n: PARENT for n in names if n.startswith("self_")}
    index_of |= {n: SENTENCE for n in names if n.startswith("src_")}
    if PARENT not in index_of.values() or SENTENCE not in index_of.values():
        raise ValueError(f"{path}: not a decoder-step graph (inputs: {', '.join(names)})")
    for node in graph.node:  # the graph's own nodes read the gathered rows
        for j, name in enumerate(node.input):
            if name in index_of:
                node.input[j] = f"{name}_rows"
    gathers = [helper.make_node("Gather", [name, index], [f"{name}_rows"], name=f"{name}_rows", axis=0)
               for name, index in index_of.items()]
    for gather in reversed(gathers):  # before every node that reads them (graph order is topological)
        graph.node.insert(0, gather)
    for value in graph.input:  # the inputs' first axis is no longer the step's rows
        if value.name in index_of:
            value.type.tensor_type.shape.dim[0].dim_param = "past_rows" if index_of[value.name] == PARENT else "sentences"
    graph.input.extend([helper.make_tensor_value_info(PARENT, TensorProto.INT64, ["batch"]),
                        helper.make_tensor_value_info(SENTENCE, TensorProto.INT64, ["step_sentences"])])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
