"""Optional libraries: import one, or raise a one-line error naming the extra that installs it."""

from __future__ import annotations

import importlib
from types import ModuleType

from attnmt.errors import AttnmtError

EXTRA_OF = {"ctranslate2": "export", "onnx": "export", "onnxruntime": "export",
            "transformers": "hf", "huggingface_hub": "hf"}


def require(module: str) -> ModuleType:
    """Import ``module`` (one of :data:`EXTRA_OF`).

    Raises:
        AttnmtError: it is not installed; the message names the extra, e.g.
            ``pip install 'attnmt[export]'``.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise AttnmtError(f"{module} is not installed; install it with: pip install 'attnmt[{EXTRA_OF[module]}]'") from None
