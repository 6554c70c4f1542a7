// Encode text with the page's tokenizer in Node, for the tests that compare it with Python's
// SentencePiece: node tools/encode.mjs MODEL.model [PIECES.json --mapped] < lines.jsonl
// Each input line is a JSON string; each output line the JSON list of its ids.
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { Tokenizer } from "../src/tokenizer.js";

const [model, pieces, mapped] = process.argv.slice(2);
const tok = await Tokenizer.load(readFileSync(model), pieces ? JSON.parse(readFileSync(pieces, "utf-8")) : [],
                                 mapped === "--mapped");
const out = [];
for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
  if (line) out.push(JSON.stringify(tok.encode(JSON.parse(line))));
}
process.stdout.write(out.join("\n") + "\n");
