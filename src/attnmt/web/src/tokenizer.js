// Text <-> ids with SentencePiece compiled to WebAssembly (@sctg/sentencepiece-js), as
// attnmt.data.tokenizers does in Python:
//   - attnmt's own models: one SentencePiece model (or one per side) whose ids are the model's ids;
//   - imported MarianMT models: separate source and target SentencePiece models whose pieces are
//     looked up in one shared vocabulary (vocab.json, the piece of each id), unknown pieces -> UNK.
import { SentencePieceProcessor } from "@sctg/sentencepiece-js";

export const PAD_ID = 0, UNK_ID = 1, BOS_ID = 2, EOS_ID = 3;

/** A SentencePiece processor loaded from the bytes of a .model file. */
async function loadProcessor(bytes) {
  const sp = new SentencePieceProcessor();
  // The package's public loaders read a file path (Node) or a base64 string; both end in
  // _loadModel(bytes), which we call directly with the fetched bytes.
  await sp._loadModel(bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes));
  return sp;
}

export class Tokenizer {
  /**
   * @param sp a loaded SentencePieceProcessor
   * @param {string[]} pieces the piece of every model id
   * @param {boolean} mapped true for MarianMT: pieces map to ids through `pieces` (vocab.json);
   *   false: SentencePiece's own ids are the model's ids
   */
  constructor(sp, pieces, mapped) {
    this.sp = sp;
    this.vocab = pieces;
    this.mapped = mapped;
    // Text SentencePiece leaves unknown comes out as its own characters: it must not be looked up
    // among the vocabulary's reserved entries (padding, unknown, end, OPUS-MT's >>fra<< tags), as
    // in Python's VocabTokenizer.
    const reserved = new Set([PAD_ID, UNK_ID, EOS_ID].map((i) => pieces[i]));
    const isTag = (p) => p.length > 4 && p.startsWith(">>") && p.endsWith("<<");
    this.ids = mapped ? new Map(pieces.map((p, i) => [p, i]).filter(([p]) => !reserved.has(p) && !isTag(p)))
      : null;
  }

  /** @param {Uint8Array | ArrayBuffer} modelBytes the .model file */
  static async load(modelBytes, pieces, mapped) {
    return new Tokenizer(await loadProcessor(modelBytes), pieces, mapped);
  }

  /** The ids of raw text, without BOS/EOS (Python: Tokenizer.encode / VocabTokenizer.encode). */
  encode(text) {
    if (!this.mapped) return this.sp.encodeIds(text);
    return this.sp.encodePieces(text).map((p) => this.ids.get(p) ?? UNK_ID);
  }

  /** The pieces of ids, for display ('\u2581' marks a word start). */
  pieces(ids) {
    return ids.map((i) => this.vocab[i]);
  }

  /** Raw text of ids; PAD, EOS (and BOS for attnmt's own models) are dropped, as in Python. */
  decode(ids) {
    if (!this.mapped) return this.sp.decodeIds(ids.filter((i) => i !== PAD_ID && i !== BOS_ID && i !== EOS_ID));
    // MarianMT: the target SentencePiece model decodes the vocabulary's pieces (Python's
    // decode_pieces), through its own ids.
    const pieces = ids.filter((i) => i !== PAD_ID && i !== EOS_ID).map((i) => this.vocab[i]);
    const spIds = pieces.map((p) => this._pieceId(p));
    if (spIds.every((id, j) => id !== this.unkId || pieces[j] === "<unk>")) return this.sp.decodeIds(spIds);
    // A piece the target model lacks: SentencePiece writes it verbatim; the others with spaces.
    const text = pieces.map((p, j) => (spIds[j] !== this.unkId ? p.replaceAll("\u2581", " ")
      : p === "<unk>" ? " \u2047 " : p)).join("");
    return text.startsWith(" ") ? text.slice(1) : text;
  }

  get unkId() {
    if (this._unk === undefined) this._unk = this._pieceId("<unk>");
    return this._unk;
  }

  _pieceId(piece) {
    if (!this._idOf) this._idOf = new Map();
    if (!this._idOf.has(piece)) {
      // the processor's string arguments are Embind string views, as the package builds them
      const sv = new this.sp.sentencepiece.StringView(piece);
      const view = sv.getView();
      this._idOf.set(piece, this.sp.processor.PieceToId(view));
      view.delete();
      sv.delete();
    }
    return this._idOf.get(piece);
  }
}
