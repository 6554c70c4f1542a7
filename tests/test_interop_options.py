"""The model options an imported MarianMT model needs, each on its own: the sinusoid layout,
embedding scaling, the decoder's start token, forbidden output ids, an optional data section,
and the tokenizer that maps SentencePiece pieces through a separate vocabulary."""

from __future__ import annotations

import math

import pytest
import torch

from attnmt import rundir
from attnmt.config import ModelConfig, config_from_dict
from attnmt.data.tokenizers import EOS_ID, PAD_ID, UNK_ID, Tokenizer, VocabTokenizer
from attnmt.errors import ConfigError
from attnmt.model.positional import sinusoidal_table
from attnmt.search.beam import beam_search
from attnmt.search.greedy import greedy_search
from attnmt.search.options import SearchOptions
from tests.conftest import tiny_model


def test_sinusoid_layout_halves_puts_sines_first():
    """'halves': PE(pos, i) = sin(pos / 10000^(2i/D)), PE(pos, D/2 + i) = cos(...), i < D/2;
    'interleaved' (the paper) puts the same values on even and odd dimensions."""
    d = 8
    halves, interleaved = sinusoidal_table(20, d, "halves"), sinusoidal_table(20, d)
    for pos in (0, 3, 17):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert halves[pos, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert halves[pos, d // 2 + i].item() == pytest.approx(math.cos(angle), abs=1e-6)
            assert interleaved[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert interleaved[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    model = tiny_model(positional_layout="halves")
    assert torch.equal(model.encoder.positions.table, sinusoidal_table(128, 32, "halves"))
    with pytest.raises(ValueError):
        sinusoidal_table(4, 7, "halves")


def test_scale_embedding_off_leaves_the_rows_unscaled():
    """``scale_embeddings``: embeddings times sqrt(d_model) (the paper), or as stored."""
    scaled, plain = tiny_model(), tiny_model(scale_embeddings=False)
    tokens = torch.tensor([[4, 5]])
    assert torch.allclose(scaled.encoder.embedding(tokens), plain.encoder.embedding(tokens) * math.sqrt(32))
    assert torch.equal(plain.encoder.embedding(tokens), plain.encoder.embedding.weight[[4, 5]][None])


class _Recorder:
    """Wraps a model and records the tokens fed at the first decoding step."""

    def __init__(self, model):
        self.model, self.first = model, None
        self.config, self.pad_id = model.config, model.pad_id

    def encode(self, src):
        return self.model.encode(src)

    def init_cache(self):
        return self.model.init_cache()

    def decode_step(self, tokens, memory, src_mask, cache):
        if self.first is None:
            self.first = tokens[:, 0].tolist()
        return self.model.decode_step(tokens, memory, src_mask, cache)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_decoder_start_id_is_the_first_decoder_input(search):
    """``decoder_start_id``: greedy and beam search feed it first (attnmt: BOS; Marian: pad)."""
    src = torch.tensor([[5, 6, EOS_ID]])
    for start in (2, PAD_ID, 7):
        rec = _Recorder(tiny_model(decoder_start_id=start))
        if search == "greedy":
            greedy_search(rec, src, 0.0, 3)
        else:
            beam_search(rec, src, SearchOptions(beam_size=2, length_penalty=0.0, max_len_a=0.0, max_len_b=3))
        assert set(rec.first) == {start}
    with pytest.raises(Exception):
        ModelConfig(decoder_start_id=-1)


def test_forbidden_ids_are_never_output_and_others_keep_their_log_probs():
    """``forbidden_ids``: log-probability -inf after the log-softmax, the others unchanged; a
    search then never outputs them even where the logit bias makes them likeliest."""
    plain = tiny_model(output_bias=True)
    with torch.no_grad():
        plain.decoder.output_projection.bias[9] = 20.0  # token 9 wins everywhere
    forbidding = tiny_model(output_bias=True, forbidden_ids=[9, PAD_ID])
    forbidding.load_state_dict(plain.state_dict())
    src = torch.tensor([[5, 6, 7, EOS_ID]])
    memory, src_mask, _ = plain.encode(src)
    tokens = torch.tensor([[2]])
    a = plain.decode_step(tokens, memory, src_mask, plain.init_cache())
    b = forbidding.decode_step(tokens, memory, src_mask, forbidding.init_cache())
    assert b[0, 9] == float("-inf") and b[0, PAD_ID] == float("-inf")
    keep = [i for i in range(a.size(1)) if i not in (9, PAD_ID)]
    assert torch.allclose(a[0, keep], b[0, keep])
    assert all(9 in h.tokens for h in greedy_search(plain, src, 0.0, 4))
    beams = beam_search(forbidding, src, SearchOptions(beam_size=3, length_penalty=0.0))
    for h in greedy_search(forbidding, src, 0.0, 4) + [hs[0] for hs in beams]:
        assert 9 not in h.tokens and PAD_ID not in h.tokens


def test_data_section_is_optional_but_training_needs_it(tmp_path):
    """An imported model's config.yaml has no data section; training from it is refused."""
    from attnmt.train.loop import train

    config = config_from_dict({"model": {"d_model": 16, "num_heads": 2}})
    assert config.data is None
    with pytest.raises(ConfigError, match="data section"):
        train(config, tmp_path / "run", progress=False)


def test_vocab_tokenizer_maps_pieces_through_the_vocabulary(tmp_path):
    """Pieces of the SentencePiece model -> ids of the separate vocabulary (unknown pieces ->
    UNK); decode drops PAD and EOS; the model directory round-trips it through vocab.json."""
    lines = ["ein mann fährt rad", "eine frau liest ein buch", "zwei hunde spielen im park"] * 30
    sp = Tokenizer.train(lines, vocab_size=40, model_type="bpe")
    pieces = [sp.pieces([i])[0] for i in range(4, len(sp))]
    vocab = ["<pad>", "<unk>", pieces[0], "</s>"] + list(reversed(pieces[1:]))
    vocab.remove("▁ein")  # an unknown piece from now on
    tok = VocabTokenizer(sp._proto, vocab)
    ids = tok.encode("ein mann")
    assert tok.pieces(ids) == [p if p in vocab else "<unk>" for p in sp.pieces(sp.encode("ein mann"))]
    assert UNK_ID in ids and len(tok) == len(vocab)
    known = tok.encode("zwei hunde")
    assert tok.decode(known + [EOS_ID, PAD_ID]) == "zwei hunde"
    assert tok.encode_batch(["zwei hunde", "ein mann"]) == [known, ids]
    rundir.write_tokenizers(tmp_path, tok, tok)
    src, tgt = rundir.read_tokenizers(tmp_path)
    assert isinstance(src, VocabTokenizer) and src.vocab == vocab and tgt.encode("zwei hunde") == known
