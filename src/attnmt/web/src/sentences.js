// The sentences of a pasted text, for the exported page (attnmt serve's page, a single file,
// applies the same rule in its own script): the browser's own sentence segmentation,
// Intl.Segmenter with granularity "sentence", which applies the sentence boundary rules of
// Unicode's UAX #29 (ICU) in the source language's locale.
//
// It is simpler than the segmenter of attnmt's document layer: it knows no abbreviations, so a
// period followed by a space and a capital letter ends a sentence ("z. B. am", "Dr. Müller" are
// cut after the period), a period followed by a lowercase letter never does, and every line break
// ends a sentence (a sentence wrapped over two lines is translated in two pieces).
//
// Nothing of the text is lost: each sentence keeps the whitespace around it (spaces, line breaks,
// blank lines), which comes back around its translation (joinTranslations).

/**
 * The text cut into parts, in order, whose before + sentence + after concatenated give `text`
 * back exactly; `sentence` is "" for a part that is only whitespace.
 *
 * @param {string} text the pasted text
 * @param {string | undefined} lang the source language's code ("de", "pt_BR"); undefined, or a
 *   code the browser does not know, segments by the rules common to all languages
 * @returns {{before: string, sentence: string, after: string}[]}
 */
export function segmentSentences(text, lang) {
  let segmenter;
  try {
    segmenter = new Intl.Segmenter(lang ? lang.replaceAll("_", "-") : undefined, { granularity: "sentence" });
  } catch {  // RangeError: not a BCP 47 tag
    segmenter = new Intl.Segmenter(undefined, { granularity: "sentence" });
  }
  return Array.from(segmenter.segment(text), ({ segment }) => {
    const [, before, sentence, after] = /^(\s*)([\s\S]*?)(\s*)$/.exec(segment);
    return { before, sentence, after };
  });
}

/** The sentences of segmentSentences' parts to translate (the non-empty ones), in order. */
export function sentencesOf(parts) {
  return parts.filter((p) => p.sentence).map((p) => p.sentence);
}

/**
 * The translated text: each sentence of `parts` replaced by its translation, the whitespace
 * around it kept.
 *
 * @param parts segmentSentences' parts
 * @param {string[]} translations one per sentence of sentencesOf(parts), in order
 */
export function joinTranslations(parts, translations) {
  if (translations.length !== sentencesOf(parts).length) {
    throw new Error(`${translations.length} translations for ${sentencesOf(parts).length} sentences`);
  }
  let k = 0;
  return parts.map((p) => p.before + (p.sentence ? translations[k++] : "") + p.after).join("");
}
