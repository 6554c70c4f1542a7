"""The native engine: the PyTorch Transformer with attnmt's greedy and beam search.

It implements ``attnmt.decode.engine.Engine`` with the PyTorch model as its step model
(``attnmt.search.step_model``), supports every search option (attention too) and has every
capability (``attnmt.decode.engine.CAPABILITIES``): the device, the precision (fp32, bf16,
int8; or auto, the faster of fp32 and bf16 here), the attention kernel, and forced decoding
(scores and all attention weights of a given output).

Shapes: B batch, S source length, T output length, L layers, H heads, V vocabulary.
"""

from __future__ import annotations

import torch

from attnmt.config import canonical_name
from attnmt.errors import OptionError
from attnmt.data.batching import pad_sequences
from attnmt.decode.calibration import translation_choice
from attnmt.decode.engine import CAPABILITIES, Hypothesis, SearchOptions, check_positions
from attnmt.device import configure, resolve_device, to_device
from attnmt.model.transformer import Transformer
from attnmt.precision import PRECISIONS, effective_precision
from attnmt.search.batched import search_batch
from attnmt.search.options import CORE_OPTIONS


class NativeEngine:
    """A PyTorch Transformer searched by ``attnmt.search``.

    Args:
        model: the Transformer (put in eval mode here).
        device: 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps' (``attnmt.device``).
        precision: 'fp32', 'bf16', 'int8' or 'auto' (:meth:`set_precision`).
        attention: 'explicit' or 'fused' (:meth:`set_attention`); default 'fused' on CUDA,
            else 'explicit'.
    Raises:
        ConfigError: an unknown device or one this machine does not have.
        ValueError: an unknown precision or attention kind.
    """

    name = "native"
    supports = CORE_OPTIONS | {"exact_stopping", "return_attention", "constraints", "streaming"}
    load_options = frozenset({"weights", "precision", "attention"})
    capabilities = frozenset(CAPABILITIES)

    def __init__(self, model: Transformer, device: str = "auto", precision: str = "fp32",
                 attention: str | None = None):
        self.model = model.eval()
        self._device = torch.device("cpu")
        self._precision = "fp32"
        self.set_device(device)
        self.set_precision(precision)
        self.set_attention(attention or ("fused" if self._device.type == "cuda" else "explicit"))

    @property
    def device(self) -> str:
        """Where the model and the search's tensors live, e.g. 'cpu' or 'cuda:0'."""
        return str(self._device)

    @property
    def torch_device(self) -> torch.device:
        return self._device

    @property
    def precision(self) -> str:
        """The precision the model runs at now: 'fp32', 'bf16' or 'int8'."""
        return self._precision

    def set_device(self, name: str) -> None:
        """Move the model to a device ('auto', 'cpu', 'cuda', 'cuda:N', 'mps'; ``attnmt.device``);
        search batches and caches follow it. int8 models stay on the CPU.

        Raises:
            ConfigError: an unknown name or a device this machine does not have.
            ValueError: a non-CPU device for an int8-quantised model.
        """
        device = resolve_device(name)
        if device.type != "cpu" and self._precision == "int8":
            raise OptionError("int8 (dynamically quantised) models run on the CPU only")
        configure(device)
        self.model.to(device)
        self._device = device

    def set_precision(self, precision: str) -> None:
        """Switch the inference precision: 'fp32'; 'bf16' (weights and activations in bfloat16,
        scores accumulated in float32); 'int8' (Linear layers dynamically quantised to int8
        with ``torch.ao.quantization.quantize_dynamic``, activations float32; CPU only); or
        'auto': fp32 or bf16, whichever searches this model faster here
        (``attnmt.decode.calibration``; :attr:`precision` then names the one chosen).

        On a CPU without fast bfloat16 kernels 'bf16' means 'fp32', with a warning
        (``attnmt.precision.effective_precision``).

        Raises:
            ValueError: an unknown precision, or going back from int8.
        """
        precision = canonical_name(precision)
        if precision not in PRECISIONS and precision != "auto":
            raise OptionError(f"unknown precision {precision!r}; use auto, {', '.join(PRECISIONS)}")
        if precision == "auto" and self._precision == "int8":
            raise OptionError("an int8-quantised model cannot be converted back; load it again")
        if precision == "auto":  # timed on this model and device (attnmt.decode.calibration)
            self.model = self.model.float()
            precision = translation_choice(self.model, self._device).precision
        if self._device.type == "cpu":
            precision = effective_precision(precision, "translation")
        if self._precision == "int8" and precision != "int8":
            raise OptionError("an int8-quantised model cannot be converted back; load it again")
        if precision == "int8" and self._device.type != "cpu":
            raise OptionError("int8 (dynamic quantisation) runs on the CPU only; use --device cpu")
        if precision == "int8" and self._precision != "int8":
            from torch.ao.quantization import quantize_dynamic

            self.model = quantize_dynamic(self.model.float(), {torch.nn.Linear}, dtype=torch.qint8)
        elif precision in ("fp32", "bf16"):
            self.model = self.model.to(torch.bfloat16 if precision == "bf16" else torch.float32)
        self._precision = precision

    def set_attention(self, kind: str) -> None:
        """The attention kernel: 'explicit' (equation 1 as written) or 'fused' (PyTorch's
        ``scaled_dot_product_attention``); the same function, different speed.

        Raises:
            ValueError: another kind.
        """
        if kind not in ("explicit", "fused"):
            raise OptionError(f"unknown attention kind {kind!r}; use explicit or fused")
        self.model.set_fused_attention(encoder=kind == "fused", decoder=kind == "fused")
        self.attention_kind = kind

    @torch.no_grad()
    def translate(self, sources: list[list[int]], options: SearchOptions) -> list[list[Hypothesis]]:
        """Greedy or beam search (``attnmt.search.batched.search_batch``) of one batch; with
        ``return_attention`` the best hypothesis of each sentence gets its source attention
        (``Engine`` contract in ``attnmt.decode.engine``).

        Raises:
            PositionError: a source longer than the model's max_positions (before any work).
        """
        check_positions(sources, self.model.config.max_positions, "source")
        hyps = search_batch(self.model, sources, options, self._device)
        if options.return_attention:
            for src, hs in zip(sources, hyps):
                hs[0].attention = self.attention(src, hs[0].tokens)["source"]
        return hyps

    @torch.no_grad()
    def attention(self, src_ids: list[int], out_ids: list[int]) -> dict[str, torch.Tensor]:
        """All attention weights of a forced output, float32, one tensor per kind:

        'source': encoder-decoder attention (L, H, T, S); 'encoder': encoder self-attention
        (L, H, S, S); 'decoder': decoder self-attention (L, H, T, T).

        Args:
            src_ids: source ids ending with EOS (S of them).
            out_ids: output ids (T of them, usually ending with EOS); row t is the attention
                used to predict ``out_ids[t]``.
        """
        src = torch.tensor([src_ids], device=self._device)  # (1, S)
        start = self.model.config.decoder_start_id  # BOS
        tgt_in = torch.tensor([[start] + out_ids[:-1]] if out_ids else [[start]], device=self._device)  # (1, T)
        memory, src_mask, enc_w = self.model.encode(src, need_weights=True)
        out = self.model.decode(tgt_in, memory, src_mask, need_weights=True)
        stack = lambda ws: torch.stack([w[0].float().cpu() for w in ws])  # noqa: E731  (L, H, ., .)
        return {"source": stack(out.src_attn), "encoder": stack(enc_w), "decoder": stack(out.self_attn)}

    @torch.no_grad()
    def forced_log_probs(self, sources: list[list[int]], targets: list[list[int]]) -> list[list[float]]:
        """Forced decoding of one batch: the natural-log probability of each target token.

        Args:
            sources: source ids ending with EOS; targets: output ids ending with EOS, pairwise.
        Returns:
            Per pair, one log-probability per target id.
        Raises:
            PositionError: a source or target longer than the model's max_positions (before any work).
        """
        check_positions(sources, self.model.config.max_positions, "source")
        check_positions(targets, self.model.config.max_positions, "target")
        start = self.model.config.decoder_start_id  # BOS
        src = to_device(pad_sequences(sources), self._device)  # (B, S)
        tgt_in = to_device(pad_sequences([[start] + t[:-1] for t in targets]), self._device)  # (B, T)
        memory, src_mask, _ = self.model.encode(src)
        logits = self.model.decode(tgt_in, memory, src_mask).logits.float().cpu()
        logp = torch.log_softmax(logits, dim=-1)  # (B, T, V)
        return [logp[row, torch.arange(len(ids)), torch.tensor(ids)].tolist() for row, ids in enumerate(targets)]
