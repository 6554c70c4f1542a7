"""Where inline markup goes in a translation: over the words aligned to the words it wrapped.

As Bergamot (Firefox Translations) does, a span of the source (``<b>Haus</b>``, a link, a
docx run) is placed over the target words whose aligned source word lies inside it: from the
first to the last of them. Alignments come from the engine's source attention
(``attnmt.decode.alignment``: each target word linked to one source word). An engine that
gives no attention (ONNX Runtime) is aligned by position instead (:func:`by_position`: target
word j to the source word at the same relative place), which keeps tags around the right
words where the two languages keep the same word order and moves them elsewhere.

The spans placed stay well formed: a span is clipped into the span around it and off the
words its earlier siblings took, keeping its longest run of free words; one left with no word
becomes a point after the target word aligned to the nearest source word before it.
"""

from __future__ import annotations


def by_position(n_src: int, n_tgt: int) -> list[tuple[int, int]]:
    """The positional alignment: target word j to source word ``(j + 0.5) * n_src / n_tgt``
    (rounded down), as (source, target) pairs; empty when either side has no word."""
    if not n_src or not n_tgt:
        return []
    return [(min(n_src - 1, int((j + 0.5) * n_src / n_tgt)), j) for j in range(n_tgt)]


def place(spans: list[tuple[int, int]], src_words: list[tuple[int, int]], tgt_words: list[tuple[int, int]],
          links: list[tuple[int, int]], start: int) -> list[tuple[int, int]]:
    """The target character range of each source span (module docstring).

    Args:
        spans: source (start, end) characters, nested or disjoint; start == end is a point.
        src_words, tgt_words: (start, end) characters of the source's and the translation's words.
        links: (source word, target word) alignment pairs, indices into those lists.
        start: where a point with no word before it goes (the translation's first character).
    Returns:
        Per span, in order, its (start, end) characters in the translation (start == end: a point).
    """
    aligned: dict[int, list[int]] = {}
    for i, j in links:
        aligned.setdefault(i, []).append(j)
    order = sorted(range(len(spans)), key=lambda k: (spans[k][0], -spans[k][1], k))  # outer first
    words: dict[int, list[int]] = {}  # span -> the target words it covers
    placed: list[int] = []
    out: list[tuple[int, int]] = [(start, start)] * len(spans)
    for k in order:
        a, b = spans[k]
        inside = [i for i, (s, e) in enumerate(src_words) if s < b and e > a]
        ancestors = [p for p in placed if spans[p][0] <= a and b <= spans[p][1]  # all placed before k
                     and (a < b or a < spans[p][1])]  # a point where a span ends is after it
        parent = ancestors[-1] if ancestors else None  # outer first: the last ancestor is the innermost
        allowed = set(words[parent]) if parent is not None else set(range(len(tgt_words)))
        for p in placed:
            if p not in ancestors:
                allowed -= set(words[p])
        candidates = sorted({j for i in inside for j in aligned.get(i, []) if j in allowed})
        run = _longest_run(candidates, allowed) if a < b else []
        words[k] = run
        placed.append(k)
        if run:
            out[k] = (tgt_words[run[0]][0], tgt_words[run[-1]][1])
        else:
            out[k] = _point(a, src_words, tgt_words, aligned, allowed, start, out[parent] if parent is not None
                            else None)
    return out


def _longest_run(candidates: list[int], allowed: set[int]) -> list[int]:
    """The longest run of ``allowed`` words from one candidate to another with no forbidden word between."""
    best: list[int] = []
    run: list[int] = []
    for j in candidates:
        if run and any(x not in allowed for x in range(run[-1] + 1, j)):
            run = []
        run = run + list(range(run[-1] + 1, j + 1)) if run else [j]
        best = run if len(run) > len(best) else best
    return best


def _point(at: int, src_words, tgt_words, aligned, allowed, start, parent_range) -> tuple[int, int]:
    """Where a span with no target word goes: after the target word aligned to the last source
    word before ``at`` (within the parent span where there is one)."""
    before = [i for i, (s, e) in enumerate(src_words) if e <= at]
    for i in reversed(before):
        targets = [j for j in aligned.get(i, []) if j in allowed]
        if targets:
            pos = tgt_words[max(targets)][1]
            break
    else:
        pos = parent_range[0] if parent_range is not None else start
    if parent_range is not None:
        pos = min(max(pos, parent_range[0]), parent_range[1])
    return (pos, pos)
