"""The compiled training step: ``torch.compile`` of a function, whether it can run here, and
what it compiled.

``train.compile`` (a speed switch) sends the encoder and decoder stacks of the loss through
TorchInductor, which builds C++ kernels on CPU. Without a C++ compiler the trainer trains eager
with a warning (:func:`compiler_missing`); a compiler that is there but does not run
(:func:`check_compiler`, before training), or a compilation that fails (:func:`compiled`), ends
the command with one line (``EnvironmentFailure``, exit status 1), not a traceback: it is the
machine's failure, and the run resumes once it is fixed or without ``train.compile``.

Library: torch.compile (TorchDynamo and TorchInductor).
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
from typing import Callable

import torch

from attnmt import environment
from attnmt.errors import EnvironmentFailure, library_call

log = logging.getLogger(__name__)


def compiled(function: Callable) -> Callable:
    """``function`` through ``torch.compile`` (the inductor backend) with dynamic shapes, so that
    batches of new lengths reuse the compiled code instead of compiling again; random draws
    (dropout) are PyTorch's own kernels (``fallback_random``), so a seed gives the eager run's
    masks. How many graphs a run compiled is :func:`compiled_graphs`.

    Raises (when called):
        EnvironmentFailure: ``torch.compile`` could not compile (:func:`compile_errors`).

    Library: torch.compile (TorchDynamo and TorchInductor).
    """
    import torch._inductor.config as inductor_config

    inductor_config.fallback_random = True
    compiled_function = torch.compile(function, dynamic=True)

    @functools.wraps(function)
    def call(*args, **kwargs):
        with library_call("train.compile: torch.compile", "check the C++ compiler ($CXX, else g++ on PATH) or train "
                          "without compiling (--set train.compile=false)", compile_errors()):
            return compiled_function(*args, **kwargs)
    return call


def compile_errors() -> tuple[type[BaseException], ...]:
    """The exceptions by which ``torch.compile`` reports that it could not compile (a C++
    compiler that fails, a backend that raises), as opposed to errors of the compiled code."""
    import torch._dynamo.exc as dynamo_exc
    import torch._inductor.exc as inductor_exc

    names = [(dynamo_exc, "BackendCompilerFailed"), (inductor_exc, "InductorError"), (inductor_exc, "CppCompileError"),
             (inductor_exc, "InvalidCxxCompiler")]
    return (subprocess.CalledProcessError, *(getattr(m, n) for m, n in names if hasattr(m, n)))


def _compiler_names() -> list[str]:
    """The C++ compilers torch.compile may use: ``$CXX`` where set, else g++, c++ or clang++."""
    cxx = environment.command(environment.CXX)
    return [cxx] if cxx else ["g++", "c++", "clang++"]


def compiler_missing(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot run here, or None: on CPU the inductor backend builds its
    kernels with a C++ compiler (``$CXX``, else g++, c++ or clang++ on PATH)."""
    if device.type != "cpu":
        return None
    names = _compiler_names()
    if any(shutil.which(name) for name in names):
        return None
    return "no C++ compiler on PATH (Debian package g++), which torch.compile needs on CPU"


def compiles_here(wanted: bool, device: torch.device) -> bool:
    """Whether the training step goes through ``torch.compile``: ``wanted`` (``train.compile``)
    and a C++ compiler here (on CPU); without one, False and a warning (training eager).

    Raises:
        EnvironmentFailure: a compiler is there but does not run (:func:`check_compiler`).
    """
    if not wanted:
        return False
    missing = compiler_missing(device)
    if missing:
        log.warning("train.compile: %s: training eager instead", missing)
        return False
    check_compiler(device)
    return True


def check_compiler(device: torch.device) -> None:
    """Before training: the C++ compiler that :func:`compiler_missing` found runs (``--version``,
    its output captured), so that a broken one ends the command before any work, in one line.

    Raises:
        EnvironmentFailure: it exits with an error, cannot be started, or hangs for 60 s.
    """
    if device.type != "cpu":
        return
    names = _compiler_names()
    path = next((found for name in names if (found := shutil.which(name))), None)
    if path is None:
        return
    try:
        run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        problem = getattr(e, "strerror", None) or str(e)
    else:
        if run.returncode == 0:
            return
        said = (run.stderr or run.stdout).strip().splitlines()
        problem = f"'{path} --version' exits with status {run.returncode}" + (f": {said[0]}" if said else "")
    raise EnvironmentFailure(f"train.compile: the C++ compiler {path} does not work ({problem}); fix or reinstall "
                             f"it (Debian package g++), or train without compiling (--set train.compile=false)")


def compiled_graphs() -> tuple[int, float]:
    """The graphs TorchDynamo has compiled in this process (recompilations included) and the
    seconds spent compiling them, forward and backward graphs (wall clock, part of the run's
    minutes)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    seconds = sum(t for key, times in compilation_time_metrics.items()
                  if key == "_compile.compile_inner" or key.endswith("bw_compiler") for t in times)
    return int(counters["stats"]["unique_graphs"]), seconds
