"""The limits and batching parameters of ``attnmt serve``, validated once (pydantic).

Every limit has a default that suits a CPU server with one model; the command line overrides
them with ``--set NAME=VALUE``. Every limit is a finite number with a range on both sides (shown
in docs/serving.md), never a boolean.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from attnmt import ranges
from attnmt.ranges import C_INT_MAX, NoBooleanNumbers

# the longest time limit, in seconds: a day (a thread's wait takes at most threading.TIMEOUT_MAX)
DAY_S = 86_400


class ServeSettings(NoBooleanNumbers):
    """Limits of the HTTP API and the dynamic batcher.

    Raises:
        pydantic.ValidationError: an unknown name, a wrong type (a boolean is no number), or a
            limit outside its range (zero, negative, not finite, or over its upper bound).
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    max_body_bytes: int = Field(1_000_000, gt=0, le=C_INT_MAX, description="largest request body in bytes (else 413)")
    max_sentences: int = Field(64, gt=0, le=C_INT_MAX, description="most sentences in one request (else 422)")
    max_chars: int = Field(2000, gt=0, le=C_INT_MAX, description="most characters in one sentence (else 422)")
    max_beam_size: int = Field(16, **ranges.BEAM_SIZE.bounds(), description="largest beam_size a request may ask for "
                               "(else 422)")
    batch_tokens: int = Field(6000, gt=0, le=C_INT_MAX, description="token budget of one search batch: sentences x "
                                                                    "longest source (subwords, padding included) x "
                                                                    "beam size; a single longer sentence still goes "
                                                                    "alone")
    max_wait_ms: float = Field(5.0, ge=0.0, le=DAY_S * 1000, description="longest a queued sentence waits for others "
                               "to share its batch, in milliseconds")
    max_queue: int = Field(2048, gt=0, le=C_INT_MAX, description="most sentences waiting for the batcher (else 503)")
    retry_after_s: int = Field(1, gt=0, le=DAY_S, description="the Retry-After header of a 503, in seconds")
    request_timeout_s: float = Field(60.0, gt=0.0, le=DAY_S, description="longest a request waits for its "
                                     "translations, in seconds (else 504)")
    keep_alive_s: float = Field(30.0, gt=0.0, le=DAY_S, description="how long an idle HTTP/1.1 connection stays open, "
                                                                    "in seconds (uvicorn's timeout_keep_alive)")
    attention_layer: int | None = Field(None, gt=0, le=1024, description="the decoder layer (1-based) whose "
                                        "head-averaged source attention is returned; default: the plot's default "
                                        "layer, or the last layer of a shallower model")
