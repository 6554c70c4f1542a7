"""Streaming a translation word by word: which words of a growing output are final.

The search reports, after each step, a sentence's *settled* tokens: all of them in greedy
search, the prefix shared by every hypothesis beam search can still return
(``attnmt.search.beam.settled_prefix``). A word of their detokenised text is final once a
later word has begun (the next subword could still extend the last word); when the search
ends, the best hypothesis' remaining words follow. :class:`WordStream` keeps how many words were
sent, so each call returns only the new final words, in order; joined by spaces, all the words
sent equal the translation's text (whitespace-separated words).

:class:`StreamJob` carries a streamed sentence between the batcher's worker thread (where the
search calls :meth:`StreamJob.on_step`) and the request's event loop (an ``asyncio.Queue``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from attnmt.data.tokenizers import EOS_ID


class WordStream:
    """The final words of one output, as its settled tokens grow.

    Args:
        decode: the target tokenizer's ids -> text.
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.sent = 0

    def update(self, tokens: list[int], final: bool = False) -> list[str]:
        """The words that became final since the last call.

        Args:
            tokens: the settled token ids (a prefix of the output; EOS ends a finished one).
            final: the search is over and ``tokens`` is the output: every word is final.
        """
        done = final or (bool(tokens) and tokens[-1] == EOS_ID)
        words = self.decode([t for t in tokens if t != EOS_ID]).split()
        upto = len(words) if done else max(len(words) - 1, 0)
        new = words[self.sent:upto]
        self.sent = max(self.sent, upto)
        return new


class StreamJob:
    """One streamed sentence: the search's reports go to an asyncio queue on ``loop``.

    ``queue`` receives lists of new final words; the request sets ``cancelled`` when its client
    goes away, and the next :meth:`on_step` then tells the search to stop the sentence.
    """

    def __init__(self, decode: Callable[[list[int]], str], loop: asyncio.AbstractEventLoop):
        self.words = WordStream(decode)
        self.loop = loop
        self.queue: asyncio.Queue[list[str]] = asyncio.Queue()
        self.cancelled = False
        self.stopped = False

    def on_step(self, tokens: list[int]) -> bool:
        """Called in the worker thread after each search step; True = stop this sentence."""
        if self.cancelled:
            self.stopped = True
            return True
        new = self.words.update(tokens)
        if new:
            try:
                self.loop.call_soon_threadsafe(self.queue.put_nowait, new)
            except RuntimeError:  # the request's loop has closed
                self.cancelled = self.stopped = True
                return True
        return False
