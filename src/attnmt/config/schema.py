"""The configuration's schema: :class:`Config`, the whole, with its sections ``data`` and
``tokenizer`` (:mod:`attnmt.config.corpus`), ``model``, ``train`` and ``decode`` (here).

Every number key has a range on both sides (its ``Field``'s bounds; those the command line and the
server share, such as ``decode.length_penalty``, from :mod:`attnmt.ranges`); each section is a
strict :class:`~attnmt.config.section.Section`. The rules between keys are :mod:`attnmt.config.rules`.

Library: pydantic.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from attnmt import ranges
from attnmt.config.corpus import DataConfig, TokenizerConfig
from attnmt.config.rules import cross_section_rules, model_section_rules
from attnmt.config.section import Section
from attnmt.ranges import C_INT_MAX

# the device names a configuration or --device may give (attnmt.device resolves them); defined
# here so that reading a configuration, and so ``attnmt prepare``, does not import PyTorch
DEVICE_NAME = r"^(auto|cpu|mps|cuda(:\d+)?)$"


class ModelConfig(Section):
    """The Transformer's hyper-parameters (Vaswani et al., 2017, Table 3; base: 512/8/2048/6)."""

    d_model: int = Field(512, **ranges.WIDTH.bounds(), description="width of embeddings and of every sub-layer's "
                                                                   "output (paper: 512)")
    num_heads: int = Field(8, **ranges.HEADS.bounds(), description="attention heads per multi-head attention (paper: 8)")
    d_ff: int = Field(2048, **ranges.WIDTH.bounds(), description="inner width of the position-wise feed-forward "
                                                                 "network (paper: 2048)")
    num_encoder_layers: int = Field(6, **ranges.LAYERS.bounds(), description="encoder layers N (paper: 6)")
    num_decoder_layers: int = Field(6, **ranges.LAYERS.bounds(), description="decoder layers N (paper: 6)")
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="P_drop on sub-layer outputs and embeddings")
    attention_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on attention weights")
    activation_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout inside the feed-forward")
    norm_first: bool = Field(False, description="pre-norm; the paper is post-norm (False)")
    positional: Literal["sinusoidal", "learned"] = Field(
        "sinusoidal", description="positional encodings: the fixed sinusoids of section 3.5, or a learned table "
        "(one trained vector per position)")
    max_positions: int = Field(1024, **ranges.POSITIONS.bounds(), description="longest sequence the positional "
                               "encodings cover (tokens, EOS included)")
    share_embeddings: bool = Field(False, description="one embedding for source and target (joint vocab)")
    tie_output: bool = Field(True, description="output projection shares the target embedding (sec. 3.4)")
    output_bias: bool = Field(False, description="a learned bias on the logits; the paper has none")
    activation: Literal["relu", "swish", "gelu"] = Field(
        "relu", description="feed-forward activation; the paper's is relu (equation 2)")
    layer_norm_eps: float = Field(1e-5, gt=0.0, le=1.0, description="epsilon of every LayerNorm (PyTorch's default "
                                                                    "1e-5)")
    pre_post_norm: bool = Field(
        False, description="LayerNorm before each sub-layer and again after the residual, "
        "LN(x + Dropout(Sublayer(LN(x)))); excludes norm_first; the paper is post-norm")
    layer_norm_scale: bool = Field(
        True, description="a learned scale (gain) in every LayerNorm; False: shift (bias) only")
    scale_embeddings: bool = Field(True, description="multiply embeddings by sqrt(d_model) (the paper, section 3.4)")
    positional_scale: bool = Field(
        False, description="a trainable scalar per side (initialised to 1) multiplying the positional encodings")
    head_dim: int | None = Field(None, **ranges.WIDTH.bounds(), description="size of each head's projections "
                                 "(num_heads * head_dim wide); None: d_model / num_heads as in the paper")
    attention_bias: bool = Field(True, description="biases in the attention projections (False: bias-free)")
    ffn_output_activation: bool = Field(
        False, description="apply the activation after the feed-forward's second layer too; the paper does not")
    time_shared_dropout: bool = Field(
        False, description="dropout on embeddings and sub-layer outputs draws one mask per sentence and feature, "
        "shared across time steps (noise shape [B, 1, D]); the paper draws per element")
    src_vectors: str | None = Field(
        None, description="fastText .vec text file whose vectors initialise the source embeddings (dimension must "
        "equal d_model); read at training start only")
    tgt_vectors: str | None = Field(None, description="the same for the target embeddings")
    freeze_embeddings: bool = Field(
        False, description="keep the token embeddings fixed in training (with src_vectors/tgt_vectors)")
    init: Literal["default", "xavier_uniform"] = Field(
        "default", description="default: Xavier-uniform matrices, embeddings N(0, 1/d_model); xavier_uniform: "
        "Xavier-uniform for every matrix, embeddings and output layer included (the PyTorch tutorial)")
    positional_layout: Literal["interleaved", "halves"] = Field(
        "interleaved", description="sinusoid layout: sin and cos interleaved on even and odd dimensions "
        "(the paper, section 3.5), or all sines in the first half and all cosines in the second (tensor2tensor, "
        "MarianMT, CTranslate2)")
    decoder_start_id: int = Field(2, ge=0, le=C_INT_MAX, description="the id fed to the decoder first: BOS (2) in "
                                                                     "attnmt's vocabularies; an imported MarianMT "
                                                                     "model starts from its pad token (0)")
    forbidden_ids: list[Annotated[int, Field(ge=0, le=C_INT_MAX)]] = Field(
        default_factory=list, description="ids search never outputs: their log-probability is set to -inf after "
        "the log-softmax (the others are not renormalised); none in the paper, MarianMT forbids its pad token")

    _rules = model_validator(mode="after")(model_section_rules)


class TrainConfig(Section):
    """Optimisation (paper section 5): Adam, the warmup schedule, label smoothing, batching."""

    seed: int = Field(1, ge=0, le=2**32 - 1, description="seed of initialisation, batch order and dropout; the same "
                                                         "seed and data give the same run")
    batch_tokens: int = Field(4096, gt=0, le=C_INT_MAX, description="padded tokens per batch (sentences x longest "
                                                                    "side)")
    accum_steps: int = Field(1, gt=0, le=C_INT_MAX, description="batches per process accumulated into one update; an "
                                                                "update takes accum_steps x processes batches")
    ddp_overlap: bool | None = Field(None, description="under torchrun: average the gradients during the backward "
                                     "pass with DistributedDataParallel (faster; each process holds a second, "
                                     "gradient-sized buffer) instead of all-reducing them after it; None: on CUDA "
                                     "only")
    dist_timeout: float = Field(1800.0, gt=0, le=10**7, description="under torchrun: seconds a process waits for "
                                "the others in a collective (rank 0's validations and preparation of text data "
                                "included) before it ends with one line naming the silent peer (exit status 1)")
    max_steps: int | None = Field(None, gt=0, le=C_INT_MAX, description="stop after this many updates (None: no limit)")
    max_epochs: int | None = Field(None, gt=0, le=C_INT_MAX, description="stop after this many passes over the "
                                   "training data (None: no limit)")
    max_minutes: float | None = Field(None, gt=0, le=10**7, description="wall-clock budget; stop cleanly after it")
    batch_sentences: int | None = Field(None, gt=0, le=C_INT_MAX, description="sentences per batch; when set, batches "
                                        "are counted in sentences, not batch_tokens")
    schedule: Literal["noam", "constant", "inverse_sqrt", "cosine_restarts", "time_budget"] = Field(
        "noam", description="noam: paper eq. 3; constant; inverse_sqrt; cosine_restarts: SGDR (Loshchilov and "
        "Hutter, 2017) as TF's CosineDecayRestarts; time_budget: warmup and decay over the fraction of "
        "max_minutes used, fitted to the measured update rate (or of max_steps, where that ends first)")
    lr: float = Field(1e-3, gt=0, le=100.0, description="peak rate for constant/inverse_sqrt/time_budget, initial rate "
                                                        "for cosine_restarts")
    lr_factor: float = Field(1.0, gt=0, le=100.0, description="'factor' of the noam schedule")
    warmup_steps: int = Field(4000, ge=0, le=C_INT_MAX, description="noam, constant, inverse_sqrt: updates of linear "
                                                                    "warmup (paper: 4000)")
    first_decay_steps: int = Field(1000, gt=0, le=C_INT_MAX, description="cosine_restarts: updates in the first period")
    t_mul: float = Field(2.0, gt=0, le=100.0, description="cosine_restarts: each period is t_mul times the previous "
                         "one")
    m_mul: float = Field(1.0, gt=0, le=1.0, description="cosine_restarts: each restart's rate is m_mul times the "
                         "previous (at most 1: a rate growing m_mul^i over i restarts would overflow)")
    alpha: float = Field(0.0, ge=0.0, le=1.0, description="cosine_restarts: the floor, as a fraction of the rate")
    warmup_fraction: float = Field(
        0.2, gt=0.0, lt=1.0, description="time_budget: share of max_minutes spent warming up")
    budget_decay: Literal["inverse_sqrt", "cosine"] = Field(
        "inverse_sqrt", description="time_budget: after warmup, lr * sqrt(w / f) (noam's shape) or a cosine to 0 at "
        "the end of the budget (f: fraction used, w: warmup_fraction)")
    optimizer: Literal["adam", "sgd"] = Field("adam", description="adam (the paper, section 5.3) or SGD")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="sgd: momentum")
    nesterov: bool = Field(True, description="sgd: Nesterov momentum (Sutskever et al., 2013)")
    loss_normalization: Literal["tokens", "sentences"] = Field(
        "tokens", description="tokens: the loss summed over a batch's target tokens / their number; sentences: each "
        "sentence's mean loss per token, averaged over the batch's sentences")
    validate_every_epoch: bool = Field(
        False, description="validate after every epoch and log the epoch's train and valid loss and perplexity "
        "with its time")
    epoch_checkpoints: bool = Field(False, description="keep the weights after every epoch as "
                                    "checkpoints/epoch_N.safetensors")
    adam_betas: tuple[Annotated[float, Field(ge=0.0, lt=1.0)], Annotated[float, Field(ge=0.0, lt=1.0)]] = Field(
        (0.9, 0.98), description="adam: beta1 and beta2 (paper: 0.9, 0.98)")
    adam_eps: float = Field(1e-9, gt=0, le=1.0, description="adam: epsilon (paper: 1e-9)")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="L2 penalty added to the gradients by the optimizer "
                                "(torch.optim's weight_decay); the paper has none")
    label_smoothing: float = Field(0.1, ge=0.0, lt=1.0, description="epsilon_ls of label smoothing (paper section "
                                   "5.4: 0.1)")
    subword_alpha: float | None = Field(
        None, gt=0.0, le=1.0, description="subword regularisation (Kudo, 2018): each training batch encodes its "
        "sentences again with a segmentation sampled by SentencePiece, a new one each time a sentence is seen and the "
        "same ones on resume; a unigram model samples P(x)^alpha (Kudo: 0.1 to 0.5), a bpe model drops merges with "
        "probability alpha (BPE-dropout, Provilkov et al., 2020: 0.1); null: the prepared segmentation")
    subword_nbest: int = Field(-1, ge=-1, le=1000, description="with subword_alpha on a unigram model: sample among "
                                                               "the n best segmentations (n >= 2), or among all of "
                                                               "them (-1: forward-filtering and backward-sampling, "
                                                               "Kudo's l = infinity)")
    dropout_curriculum: int = Field(0, ge=0, le=C_INT_MAX, description="curriculum dropout (Morerio et al., 2017): "
                                    "each dropout probability of the model section grows from 0 as p * (1 - exp(-step "
                                    "/ N)), N this many updates (0.63 p after N, 0.95 p after 3N), so early updates "
                                    "learn without the noise and later ones get the whole p; the same rates on resume; "
                                    "0: constant p")
    clip_norm: float | None = Field(1.0, gt=0, le=1e6, description="clip the gradient's global L2 norm to this (None: "
                                                                   "no clipping, as in the paper)")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "fp32", description="fp32; bf16 autocast (CPUs with fast bfloat16, CUDA); fp16 autocast with loss scaling "
        "(CUDA only, fp32 elsewhere); auto: on a CPU with bfloat16 kernels, forward and backward passes of the model "
        "on the first batches timed in fp32 and bf16 before the first update (seconds, inside max_minutes), the "
        "faster kept (bf16 only when more than 5% faster), the choice cached per CPU model in "
        "~/.cache/attnmt/precision.json and kept by the run (precision.json) on resume; fp32 on a CPU without "
        "bfloat16 kernels, bf16 on CUDA as above; the paper trained in float32")
    device: str = Field("auto", pattern=DEVICE_NAME, description="auto (CUDA, then MPS, then CPU), cpu, cuda, "
                        "cuda:N or mps; under torchrun 'cuda' is the GPU of the process's LOCAL_RANK")
    num_threads: int | None = Field(None, **ranges.THREADS.bounds(), description="CPU threads of PyTorch (None: its "
                                    "default, one per core)")
    compile: bool = Field(False, description="speed switch: the training step's encoder and decoder stack through "
                          "torch.compile (inductor, dynamic shapes; dropout draws stay PyTorch's own, so a seed gives "
                          "the eager run's masks); the compile time counts against max_minutes; false: eager")
    valid_every: int = Field(1000, gt=0, le=C_INT_MAX, description="validate every N updates")
    valid_bleu: bool = Field(True, description="validation also translates (greedy) and scores BLEU and chrF; the "
                             "best model is chosen by BLEU, else by validation loss")
    log_every: int = Field(100, gt=0, le=C_INT_MAX, description="log the training loss and speed every N updates")
    average_last: int = Field(0, ge=0, le=C_INT_MAX, description="average the last N validation checkpoints at the end")
    stop_patience: int | None = Field(None, gt=0, le=C_INT_MAX, description="stop after N validations without "
                                      "improvement")
    max_nonfinite_updates: int = Field(5, gt=0, le=C_INT_MAX, description="an update whose loss or gradient norm is "
                                       "not finite is skipped (counted and logged); after this many in a row training "
                                       "stops with an error, keeping a resumable checkpoint of the last finite state")
    init_from: str | None = Field(
        None, description="fine-tune: start from this attnmt model directory (trained, or imported with 'attnmt "
        "import marian'): its weights, its tokenizer(s) and vocabulary, its model section (and its decode section "
        "when this one sets none); keys given here must equal its own, except the dropout rates; a fresh optimizer "
        "and schedule; the starting model is validated as step 0")
    freeze: list[str] = Field(
        default_factory=list, description="parameters kept fixed in training (requires_grad off, left out of the "
        "optimizer): 'embeddings' (token embeddings and what is tied to them), 'encoder', 'decoder' (both without "
        "the token embeddings), or fnmatch patterns over parameter names such as 'decoder.layers.0.*'")


# The decoder layer whose head-averaged source attention aligned words best on the Multi30k
# German->English preset (docs/looking_inside.md); plots and the server show it by default.
DEFAULT_ATTENTION_LAYER = 2

# The decoder layer whose head-averaged source attention gives word alignments
# (``attnmt.decode.alignment``; translate --alignments, the API's ``alignments``): of the three
# layers of the Multi30k de->en preset, the one whose links hit the most hand-made links on
# test_2016 reference pairs (benchmarks/RESULTS.md, "Word alignment layer"). A shallower model
# uses its last layer.
DEFAULT_ALIGNMENT_LAYER = 3


class DecodeConfig(Section):
    """Search defaults (beam search with the GNMT length penalty, Wu et al., 2016, eq. 14)."""

    beam_size: int = Field(5, **ranges.BEAM_SIZE.bounds(), description="beam width (1: greedy search; paper: 4)")
    length_penalty: float = Field(0.6, **ranges.LENGTH_PENALTY.bounds(), description="alpha in ((k + |Y|) / (k + "
                                  "1))^alpha")
    length_penalty_k: float = Field(5.0, **ranges.LENGTH_PENALTY_K.bounds(), description="k of the gnmt length penalty "
                                    "(Wu et al.: 5)")
    length_penalty_type: Literal["gnmt", "average"] = Field(
        "gnmt", description="gnmt: log P / ((k + |Y|) / (k + 1))^alpha; average: log P / |Y| (|Y| with EOS), the mean "
        "log-probability per token, OpenNMT-py's 'avg' and CTranslate2's default")
    max_len_a: float = Field(1.5, **ranges.MAX_LEN_A.bounds(), description="max output length = a * source length + b "
                             "(tokens, EOS included); every search ends a hypothesis that reaches it there, without "
                             "EOS")
    max_len_b: int = Field(10, **ranges.MAX_LEN_B.bounds(), description="b of the output length limit a * source "
                           "length + b (tokens)")
    early_stopping: bool = Field(
        False, description="beam search's stopping rule: true stops a sentence once round(beam_size x patience) "
        "hypotheses have finished (CTranslate2's and fairseq's rule); false is exact stopping, once no open "
        "hypothesis can beat the nbest finished ones (greedy search is the same under both)")
    patience: float = Field(1.0, **ranges.PATIENCE.bounds(), description="with early_stopping: wait for "
                            "round(beam_size x patience) finished hypotheses (Kasai et al., 2022)")
    batch_size: int = Field(128, **ranges.BATCH_SIZE.bounds(), description="sentences per search batch")
    precision: Literal["auto", "fp32", "bf16", "int8"] = Field(
        "fp32", description="inference precision: float32, bfloat16, or int8 (linear layers dynamically quantised "
        "to int8, CPU only); auto: on a CPU with bfloat16 kernels, searches of the model timed in fp32 and bf16 "
        "before the first batch, the faster kept (bf16 only when more than 5% faster; never int8, which changes "
        "translations), cached per CPU model in ~/.cache/attnmt/precision.json; fp32 on a CPU without bfloat16 "
        "kernels, bf16 on a CUDA GPU that has it")
    device: str = Field("auto", pattern=DEVICE_NAME, description="auto (CUDA, then MPS, then CPU), cpu, cuda, "
                        "cuda:N or mps")
    attention: Literal["explicit", "fused"] = Field(
        "explicit", description="attention kernel for translation: the explicit formula of equation 1, or PyTorch's "
        "fused scaled_dot_product_attention (same function; the explicit one was faster for incremental decoding "
        "on the CPUs of benchmarks/RESULTS.md)")


class Config(Section):
    """The whole configuration of a run."""

    data: DataConfig | None = Field(None, description="the training corpus; absent in imported models")
    tokenizer: TokenizerConfig = Field(TokenizerConfig(), description="how text becomes token ids")
    model: ModelConfig = Field(ModelConfig(), description="the Transformer's shape and options")
    train: TrainConfig = Field(TrainConfig(), description="optimisation, batching, validation and stopping")
    decode: DecodeConfig = Field(DecodeConfig(), description="search defaults of translate, evaluate and serve")

    _rules = model_validator(mode="after")(cross_section_rules)

    def languages(self) -> tuple[str, str]:
        """(source, target) language codes: tokenizer.src_lang/tgt_lang, else from data.pair."""
        pair = self.data.pair.split("-") if self.data is not None and self.data.pair else [None, None]
        return self.tokenizer.src_lang or pair[0], self.tokenizer.tgt_lang or pair[1]
