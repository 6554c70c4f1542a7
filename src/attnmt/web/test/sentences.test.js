// sentences.js: a pasted text cut into sentences by Intl.Segmenter, its whitespace kept.
import assert from "node:assert/strict";
import { test } from "node:test";
import { joinTranslations, segmentSentences, sentencesOf } from "../src/sentences.js";

const join = (parts) => parts.map((p) => p.before + p.sentence + p.after).join("");

test("a paragraph of two sentences is two sentences, and the parts give the text back", () => {
  const text = "Ein Mann fährt Rad. Eine Frau liest!";
  const parts = segmentSentences(text, "de");
  assert.deepEqual(sentencesOf(parts), ["Ein Mann fährt Rad.", "Eine Frau liest!"]);
  assert.equal(join(parts), text);
});

test("line breaks, blank lines and spaces come back around the translations", () => {
  const text = "  Ein Hund.  Eine Katze?\n\nEin Kind spielt.\n";
  const parts = segmentSentences(text, "de");
  assert.equal(join(parts), text);
  assert.deepEqual(sentencesOf(parts), ["Ein Hund.", "Eine Katze?", "Ein Kind spielt."]);
  assert.equal(joinTranslations(parts, ["A dog.", "A cat?", "A child plays."]),
               "  A dog.  A cat?\n\nA child plays.\n");
});

test("a number's decimal point and a period before a lowercase word end no sentence", () => {
  assert.deepEqual(sentencesOf(segmentSentences("Es kostet 3.5 Euro. ein Satz. Noch einer.", "de")),
                   ["Es kostet 3.5 Euro. ein Satz.", "Noch einer."]);
});

test("empty and blank texts have no sentences; an unknown language code still segments", () => {
  assert.deepEqual(sentencesOf(segmentSentences("", "de")), []);
  assert.equal(joinTranslations(segmentSentences(" \n ", "de"), []), " \n ");
  assert.deepEqual(sentencesOf(segmentSentences("One. Two.", "not a tag!")), ["One.", "Two."]);
  assert.deepEqual(sentencesOf(segmentSentences("Um. Dois.", "pt_BR")), ["Um.", "Dois."]);
});

test("a wrong number of translations is refused", () => {
  assert.throws(() => joinTranslations(segmentSentences("One. Two.", "en"), ["Eins."]), /1 translations for 2/);
});
