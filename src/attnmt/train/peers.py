"""The other processes of a torchrun job, as a failed collective names them: each rank's network
address, and the one line a process ends with when a peer goes silent or away.

Every rank learns the others' addresses when it joins the process group
(``attnmt.train.distributed.init``). When a collective fails (gloo raises a ``RuntimeError``
after ``train.dist_timeout`` seconds without an answer, or at once when a peer's connection
closes; NCCL a ``torch.distributed.DistError``), :func:`failure` turns it into an
:class:`~attnmt.errors.EnvironmentFailure` naming the peer: the ranks whose address the
library's message gives, else, for a timeout, the ranks on other machines than this one (the
library does not say which one it waited for; with two machines that is the other). The line
also says where the last checkpoint is and how many of torchrun's restarts are left
(``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS``); the command line adds how to
continue.

Library: torch.distributed (the error types), the socket module (the local address).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from attnmt import environment
from attnmt.errors import EnvironmentFailure

SHOWN = 4  # peers named in the line; the rest are counted


class PeerLost(EnvironmentFailure):
    """A collective failed: a peer went silent for ``train.dist_timeout`` seconds, or went away.
    The message names the peer and where the last checkpoint is (the CLI adds its flags)."""


def own_address(environ: Mapping[str, str] | None = None) -> str:
    """This machine's address on the route to the rendezvous host (``MASTER_ADDR``): the source
    address of a UDP socket connected there (connecting a UDP socket sends nothing); the host
    name where that cannot be found.

    Raises:
        ConfigError: ``MASTER_PORT`` is not a port number (``attnmt.environment``)."""
    host = environment.raw(environment.MASTER_ADDR, environ)
    port = environment.number(environment.MASTER_PORT, 29500, environ)  # ConfigError: not a port
    if host is None:
        return socket.gethostname()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except (OSError, ValueError, UnicodeError):  # an address that does not resolve: torchrun's to refuse
        return socket.gethostname()


def is_collective_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective's failure (a lost or silent peer) rather than a bug:
    a ``torch.distributed.DistError``, or a ``RuntimeError`` raised by gloo's transport."""
    import torch.distributed as dist

    return isinstance(error, dist.DistError) or (isinstance(error, RuntimeError) and "gloo" in str(error))


def silent_peers(message: str, rank: int, addresses: Sequence[str]) -> list[int]:
    """The ranks that ``message`` (the library's error) points to: those whose address it names;
    else those on another machine than ``rank``; else (one machine) every other rank."""
    named = [r for r, a in enumerate(addresses) if r != rank and f"[{a}]" in message]
    if named:
        return named
    others = [r for r, a in enumerate(addresses) if r != rank and a != addresses[rank]]
    return others or [r for r in range(len(addresses)) if r != rank]


def restarts_text(environ: Mapping[str, str] | None = None) -> str:
    """What is left of torchrun's ``--max-restarts`` (empty without torchrun's agent)."""
    if environment.raw(environment.MAX_RESTARTS, environ) is None:
        return ""
    used = environment.number(environment.RESTART_COUNT, 0, environ)
    most = environment.number(environment.MAX_RESTARTS, 0, environ)
    if used >= most:
        return f"; torchrun's restarts are used up ({most}): run the same command again to continue"
    return f"; torchrun restarts the workers ({used} of {most} restarts used)"


def library_words(error: BaseException) -> str:
    """The first sentence of the library's message, without gloo's ``[source.cc:line]`` prefix
    (at most 120 characters)."""
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
    if first.startswith("[") and "] " in first:
        first = first.split("] ", 1)[1]
    return first.split(". ")[0][:120]


def failure(error: BaseException, rank: int, addresses: Sequence[str], timeout: float, checkpoint: str
            ) -> PeerLost:
    """The one-line failure of a process whose collective failed (module docstring).

    Args:
        error: the library's exception (:func:`is_collective_failure`).
        rank: this process's rank; ``addresses``: every rank's address, in rank order.
        timeout: ``train.dist_timeout`` in seconds; ``checkpoint``: where the run's last
            checkpoint is (rank 0's machine holds it).
    """
    message = str(error)
    peers = silent_peers(message, rank, addresses) if len(addresses) > 1 else []
    named = ", ".join(f"rank {r} at {addresses[r]}" for r in peers[:SHOWN])
    if len(peers) > SHOWN:
        named += f" and {len(peers) - SHOWN} more"
    if "timed out" in message.lower() or "timeout" in message.lower():
        what = f"no answer from {named or 'the other ranks'} within train.dist_timeout ({timeout:g} s)"
    else:
        what = f"lost the connection to {named or 'the other ranks'}"
    return PeerLost(f"rank {rank}: {what} ({library_words(error)}): check that machine and the network; the last "
                    f"checkpoint is {checkpoint}{restarts_text()}")
