"""Export a model directory to ONNX, and run attnmt's own search over it with ONNX Runtime.

Two graphs, exported with ``torch.onnx.export`` (the TorchScript-based exporter,
``dynamo=False``), with dynamic batch and length axes:

- ``encoder.onnx``: src (B, S) int64 -> for every decoder layer l the source attention's keys
  and values ``src_key_l``, ``src_value_l`` (B, H, S, Dh) float32, computed once per sentence.
- ``decoder_step.onnx``: one step of incremental decoding. Inputs: ``tokens`` (B, 1) int64, the
  newest token of each prefix; ``position`` (1,) int64, its position; ``src_mask`` (N, S) bool,
  True on real source tokens; per layer the self-attention cache ``self_key_l``,
  ``self_value_l`` (B, H, t, Dh) (t = 0 at the first step) and the source keys and values
  ``src_key_l``, ``src_value_l`` (N, H, S, Dh). The source side has one row per sentence: the
  B = N x K rows of a step are N sentences' K hypotheses each (K = 1 in greedy search, or when
  the source rows are given once per hypothesis), consecutive, and a sentence's K rows attend to
  its one source row together (``attnmt.model.attention.MultiHeadAttention``). Outputs:
  ``log_probs`` (B, V) float32 (with the ``forbidden_ids`` at -inf) and the grown caches
  ``new_self_key_l``, ``new_self_value_l`` (B, H, t + 1, Dh); with ``attention=True`` (the web
  export) also ``attention`` (B, L, S) float32, each decoder layer's source attention of the new
  token averaged over heads.

The graphs hold the same modules as the PyTorch model (they are traced from it, at 2 sentences x
2 hypotheses, so that both the sentence and the hypothesis axes stay dynamic).
:class:`OnnxTransformer` gives the two sessions the step-model interface that ``attnmt.search``
drives (``attnmt.search.step_model``: ``encode``, ``init_cache``, ``decode_step``, a cache with
``reorder``), so that :class:`OnnxEngine` runs attnmt's own search over them. The source keys
and values stay in ONNX Runtime values made once per set of sentences and bound to every step
(IOBinding): no step copies or repeats the source side; it moves only when sentences finish.
The export directory also receives config.yaml and the SentencePiece models (and vocab.json),
so ``attnmt translate --engine onnxruntime --model ONNX_DIR`` needs nothing else.

Shapes: N sentences, B rows (N, or N x K hypotheses), S source length, t target positions so
far, H heads, Dh head size, L decoder layers, V vocabulary.

Library: torch.onnx (export), onnx (checking), onnxruntime (``pip install 'attnmt[export]'``).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnmt import rundir
from attnmt.config import ModelConfig
from attnmt.data.shards import staging_dir
from attnmt.data.tokenizers import EOS_ID, PAD_ID
from attnmt.decode.engine import CORE_OPTIONS, Hypothesis, SearchOptions, check_positions
from attnmt.data.shards import staging_dir
from attnmt.errors import CheckpointError, ConfigError, library_call
from attnmt.interop.extras import require
from attnmt.model.attention import KVCache, LayerCache, padding_mask
from attnmt.model.transformer import Transformer, forbid
from attnmt.search.batched import search_batch
from attnmt.search.options import check_count

log = logging.getLogger(__name__)

ENCODER, DECODER_STEP = "encoder.onnx", "decoder_step.onnx"
OPSET = 17


def _names(prefix: str, num_layers: int) -> list[str]:
    """['{prefix}key_0', '{prefix}value_0', ...] for every layer."""
    return [f"{prefix}{kind}_{i}" for i in range(num_layers) for kind in ("key", "value")]


class EncoderGraph(nn.Module):
    """src (B, S) int64 -> the 2L source keys and values (B, H, S, Dh) of the decoder layers."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src: torch.Tensor) -> tuple[torch.Tensor, ...]:
        memory, _, _ = self.model.encode(src)  # (B, S, D)
        out: list[torch.Tensor] = []
        for layer in self.model.decoder.layers:
            out.extend(layer.src_attn._project_kv(memory, memory))  # (B, H, S, Dh) each
        return tuple(out)


class DecoderStepGraph(nn.Module):
    """One incremental decoding step with explicit caches (module docstring); ``attention``
    adds the head-averaged source attention (B, L, S) as the last output."""

    def __init__(self, model: Transformer, attention: bool = False):
        super().__init__()
        self.model = model
        self.attention = attention

    def _position(self, position: torch.Tensor) -> torch.Tensor:
        positions = self.model.decoder.positions
        if hasattr(positions, "table"):  # sinusoids
            return positions.table.index_select(0, position)[None]  # (1, 1, D)
        return positions.embedding(position)[None]  # learned, (1, 1, D)

    def forward(self, tokens: torch.Tensor, position: torch.Tensor, src_mask: torch.Tensor,
                *caches: torch.Tensor) -> tuple[torch.Tensor, ...]:
        decoder, num_layers = self.model.decoder, len(self.model.decoder.layers)
        self_kv, src_kv = caches[: 2 * num_layers], caches[2 * num_layers:]
        x = decoder.embedding(tokens) + self._position(position)  # (B, 1, D)
        mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        new_kv: list[torch.Tensor] = []
        src_w: list[torch.Tensor] = []
        for i, layer in enumerate(decoder.layers):
            cache = LayerCache(KVCache(self_kv[2 * i], self_kv[2 * i + 1]),
                               KVCache(src_kv[2 * i], src_kv[2 * i + 1], static=True))
            x, _, w = layer(x, None, mask, cache, need_weights=self.attention)
            new_kv += [cache.self_attn.k, cache.self_attn.v]  # (B, H, t + 1, Dh)
            if self.attention:
                src_w.append(w[:, :, 0].mean(dim=1))  # (B, H, 1, S) -> (B, S)
        logits = decoder.output_projection(decoder.final_norm(x))[:, -1]  # (B, V)
        out = (forbid(torch.log_softmax(logits, dim=-1), self.model.config.forbidden_ids), *new_kv)
        return (*out, torch.stack(src_w, dim=1)) if self.attention else out  # attention (B, L, S)


def _export_graphs(model: Transformer, output: Path, attention: bool = False) -> None:
    # The tracer warns at every Python branch on a tensor's size. Those in the model are checks that
    # raise (a length past the position table, query rows that do not split over key rows) or branches
    # that are the same at every size the graphs meet (one query position per step; the beam axis,
    # traced at 2 and computed from the sizes; the head size): not worth a screen of warnings.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        _trace_graphs(model, output, attention)


def _trace_graphs(model: Transformer, output: Path, attention: bool) -> None:
    cfg, vocab = model.config, model.decoder.output_projection.weight.size(0)
    layers = cfg.num_decoder_layers
    heads = cfg.num_heads
    head_dim = cfg.d_model // cfg.num_heads
    src = torch.randint(4, vocab, (2, 5))
    src[:, -1], src[1, -2:] = EOS_ID, torch.tensor([EOS_ID, PAD_ID])  # a padded row
    src_names = _names("src_", layers)
    torch.onnx.export(EncoderGraph(model), (src,), str(output / ENCODER), input_names=["src"],
                      output_names=src_names, opset_version=OPSET, dynamo=False,
                      dynamic_axes={"src": {0: "batch", 1: "src_len"}, **{n: {0: "batch", 2: "src_len"} for n in src_names}})
    with torch.no_grad():
        src_kv = EncoderGraph(model)(src)  # (2, H, 5, Dh): 2 sentences, each searched with 2 hypotheses below
    self_kv = [torch.randn(4, heads, 3, head_dim) for _ in range(2 * layers)]
    inputs = (torch.randint(4, vocab, (4, 1)), torch.tensor([3]), src != PAD_ID, *self_kv, *src_kv)
    self_names, new_names = _names("self_", layers), _names("new_self_", layers)
    axes = {"tokens": {0: "batch"}, "src_mask": {0: "sentences", 1: "src_len"}, "log_probs": {0: "batch"},
            **{n: {0: "batch", 2: "past_len"} for n in self_names},
            **{n: {0: "sentences", 2: "src_len"} for n in src_names}, **{n: {0: "batch", 2: "new_len"} for n in new_names}}
    if attention:
        axes["attention"] = {0: "batch", 2: "src_len"}
    torch.onnx.export(DecoderStepGraph(model, attention), inputs, str(output / DECODER_STEP),
                      input_names=["tokens", "position", "src_mask", *self_names, *src_names],
                      output_names=["log_probs", *new_names, *(["attention"] if attention else [])],
                      opset_version=OPSET, dynamo=False, dynamic_axes=axes)


def export_onnx(model_dir: str | Path, output: str | Path, attention: bool = False) -> Path:
    """Write ``encoder.onnx`` and ``decoder_step.onnx`` (module docstring) and the files
    translation needs into ``output``; both graphs pass ``onnx.checker``. ``attention`` adds
    the decoder step's ``attention`` output (for the web page's heatmap).

    Raises:
        CheckpointError: ``output`` exists and is not empty, or the model directory is incomplete.
        AttnmtError: onnx is not installed (the ``export`` extra).
        EnvironmentFailure: the exporter or the checker raised; ``output`` is left as it was.
    """
    onnx = require("onnx")
    output = Path(output)
    if output.exists() and any(output.iterdir()):
        raise CheckpointError(f"{output}: exists and is not empty; choose a new directory")
    _, _, _, model = rundir.load_model_dir(model_dir)
    model.eval().set_fused_attention(encoder=False, decoder=False)
    with staging_dir(output, empty_ok=True) as staged:  # complete or absent
        with library_call("the ONNX export (torch.onnx.export, onnx.checker)", "translate with the native engine, "
                          "or report the model's configuration as an attnmt bug", EXPORT_ERRORS), torch.no_grad():
            _export_graphs(model, staged, attention)
            for name in (ENCODER, DECODER_STEP):
                onnx.checker.check_model(str(staged / name))
        rundir.copy_translation_files(model_dir, staged)
    log.info("wrote ONNX graphs %s and %s to %s", ENCODER, DECODER_STEP, output)
    return output


EXPORT_ERRORS = (RuntimeError, ValueError)  # torch.onnx's (OnnxExporterError is a RuntimeError) and onnx.checker's


def _providers(ort, device: str) -> tuple[list, str]:
    """ONNX Runtime's execution providers for an attnmt device name, and the device's name.
    'auto' takes CUDA when this onnxruntime build has it. (The search's tensors stay on the
    CPU; ONNX Runtime copies each step's inputs to the GPU.)

    Raises:
        ConfigError: CUDA asked for without CUDAExecutionProvider, or another device.
        ValueError: a CUDA device index past a C int (ONNX Runtime's ``device_id``).
    """
    has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    if device == "cpu" or (device == "auto" and not has_cuda):
        return ["CPUExecutionProvider"], "cpu"
    if device == "auto" or device == "cuda" or device.startswith("cuda:"):
        if not has_cuda:
            raise ConfigError(f"device {device}: this onnxruntime has no CUDAExecutionProvider (pip install onnxruntime-gpu)")
        index = check_count(int(device.partition(":")[2] or 0), f"device {device}: the CUDA device index", low=0)
        return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"], f"cuda:{index}"
    raise ConfigError(f"the onnxruntime engine runs on cpu or cuda[:N], not {device}")


@dataclass
class OnnxCache:
    """The decoding state :class:`OnnxTransformer` keeps between steps.

    self_kv: the 2L self-attention keys and values, float32 (B, H, t, Dh), one row per hypothesis.
    source: the step's source inputs, one row per sentence: ``src_mask`` (N, S) bool, then the 2L
        source keys and values (N, H, S, Dh) float32 (contiguous arrays). bound: the same as ONNX
        Runtime values (made once from ``source``, without a copy on the CPU), bound to every
        step; None until the next step after ``source`` changes.
    step: positions consumed so far.
    """

    self_kv: list[np.ndarray] = field(default_factory=list)
    source: list[np.ndarray] | None = None
    bound: list | None = None
    step: int = 0

    def reorder(self, rows: torch.Tensor, sources: torch.Tensor | None = None) -> None:
        """Keep hypothesis rows ``rows`` and, if given, sentence rows ``sources`` (as
        ``attnmt.model.attention.DecoderCache.reorder``); only then does the source side move."""
        index = rows.numpy()
        self.self_kv = [a.take(index, axis=0) for a in self.self_kv]
        if sources is not None and self.source is not None:
            index = sources.numpy()
            self.source, self.bound = [a.take(index, axis=0) for a in self.source], None


class OnnxTransformer:
    """The two ONNX Runtime sessions behind the step-model interface that greedy and beam search
    use (``attnmt.search.step_model.StepModel``).

    Args:
        export_dir: written by :func:`export_onnx`.
        config: the model's configuration.
        threads: intra-op threads, 0 = ONNX Runtime's default.
    Raises:
        CheckpointError: a graph file missing, or one ONNX Runtime cannot load (truncated, empty).
        ValueError: threads out of range (``attnmt.search.options.check_count``).
    """

    def __init__(self, export_dir: str | Path, config: ModelConfig, threads: int = 0, device: str = "cpu"):
        check_count(threads, "threads", low=0)  # SessionOptions.intra_op_num_threads is a C int
        ort = require("onnxruntime")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        paths = [Path(export_dir) / name for name in (ENCODER, DECODER_STEP)]
        for path in paths:
            if not path.is_file():
                raise CheckpointError(f"{path}: missing; export it with 'attnmt export onnx'")
        providers, self.device = _providers(ort, device)
        state = ort.capi.onnxruntime_pybind11_state  # its load errors share no base class but Exception
        load_errors = tuple(getattr(state, name) for name in ("Fail", "InvalidArgument", "NoSuchFile", "NoModel",
                                                               "InvalidProtobuf", "InvalidGraph", "RuntimeException")
                            if hasattr(state, name))
        self.errors = load_errors  # what ONNX Runtime raises, at loading and at running a graph
        sessions = []
        for path in paths:
            try:
                sessions.append(ort.InferenceSession(str(path), options, providers=providers))
            except load_errors as e:  # a truncated or empty graph file
                raise CheckpointError(f"{path}: ONNX Runtime cannot load it ({str(e).splitlines()[0]}); export it "
                                      "again with 'attnmt export onnx'") from None
        self.encoder, self.decoder = sessions
        self.config, self.pad_id = config, PAD_ID
        self.num_layers, self.head_dim = config.num_decoder_layers, config.d_model // config.num_heads
        self._ort, self._ort_device = ort, "cuda" if self.device.startswith("cuda") else "cpu"
        self._device_id = int(self.device.partition(":")[2] or 0)
        self._input_names = [i.name for i in self.decoder.get_inputs()]
        self._output_names = [o.name for o in self.decoder.get_outputs()]

    def encode(self, src: torch.Tensor) -> tuple[list[np.ndarray], torch.Tensor, None]:
        """src (B, S) int64 -> the 2L source keys and values (B, H, S, Dh) float32 (numpy, as
        ``encoder.onnx`` gives them), the source mask (B, 1, 1, S) bool, and None (no attention
        weights)."""
        kv = self.encoder.run(None, {"src": src.numpy()})
        return kv, padding_mask(src, PAD_ID), None

    def init_cache(self) -> OnnxCache:
        return OnnxCache()

    def decode_step(self, tokens: torch.Tensor, memory: list[np.ndarray] | None, src_mask: torch.Tensor,
                    cache: OnnxCache) -> torch.Tensor:
        """As ``Transformer.decode_step``: tokens (B, 1) -> log-probabilities (B, V) float32;
        ``memory`` (from :meth:`encode`, needed at the first step only) and ``src_mask`` have one
        row per sentence (B / K rows in beam search), and so have the graph's source inputs."""
        if cache.source is None:
            cache.source = [np.ascontiguousarray(src_mask[:, 0, 0].numpy())] + [np.ascontiguousarray(a) for a in memory]
        if not cache.self_kv:
            empty = np.zeros((tokens.size(0), self.config.num_heads, 0, self.head_dim), dtype=np.float32)
            cache.self_kv = [empty] * (2 * self.num_layers)
        if cache.bound is None:  # once per set of sentences, not once per step
            cache.bound = [self._ort.OrtValue.ortvalue_from_numpy(a, self._ort_device, self._device_id)
                           for a in cache.source]
        binding = self.decoder.io_binding()
        names = iter(self._input_names)  # tokens, position, src_mask, self_*, src_*
        binding.bind_cpu_input(next(names), np.ascontiguousarray(tokens.numpy()))
        binding.bind_cpu_input(next(names), np.array([cache.step], dtype=np.int64))
        binding.bind_ortvalue_input(next(names), cache.bound[0])
        for a in cache.self_kv:
            binding.bind_cpu_input(next(names), a)
        for value in cache.bound[1:]:
            binding.bind_ortvalue_input(next(names), value)
        for name in self._output_names:
            binding.bind_output(name)
        self.decoder.run_with_iobinding(binding)
        out = binding.copy_outputs_to_cpu()
        cache.self_kv = out[1: 1 + 2 * self.num_layers]  # (a web export adds attention)
        cache.step += 1
        return torch.from_numpy(out[0])


class OnnxEngine:
    """An ``attnmt.decode.engine.Engine`` over an ONNX export: attnmt's own greedy and beam
    search (``attnmt.search.batched.search_batch``) with the model computed by ONNX Runtime
    (fp32; no attention weights), so its results are the native engine's up to float rounding.

    Args:
        export_dir: written by :func:`export_onnx`.
        device: 'cpu', or 'cuda' / 'cuda:N' with onnxruntime-gpu (CUDAExecutionProvider); None:
            the export's ``decode.device``.
        threads: intra-op threads, 0 = ONNX Runtime's default.
    Raises:
        CheckpointError: a graph is missing. ConfigError: a device ONNX Runtime cannot use here.
    """

    name = "onnxruntime"
    supports = CORE_OPTIONS | {"exact_stopping"}
    capabilities: frozenset[str] = frozenset()
    load_options: frozenset[str] = frozenset()
    precision = "fp32"

    def __init__(self, export_dir: str | Path, device: str | None = "cpu", threads: int = 0):
        self.config = rundir.read_config(export_dir)
        self.src_tokenizer, self.tgt_tokenizer = rundir.read_tokenizers(export_dir)
        self.model = OnnxTransformer(export_dir, self.config.model, threads, device or self.config.decode.device)

    @property
    def device(self) -> str:
        return self.model.device

    def translate(self, sources: list[list[int]], options: SearchOptions) -> list[list[Hypothesis]]:
        """Search ``sources`` (ids ending with EOS) over the ONNX graphs (``Engine`` contract;
        the caller has refused return_attention, constraints and streaming).

        Raises:
            PositionError: a source longer than max_positions, before ONNX Runtime sees it.
            EnvironmentFailure: ONNX Runtime raised while running a graph.
        """
        check_positions(sources, self.config.model.max_positions, "source")
        with library_call("ONNX Runtime (running the exported graphs)", "translate with --engine native, or export "
                          "the model again with 'attnmt export onnx'", self.model.errors):
            return search_batch(self.model, sources, options)
