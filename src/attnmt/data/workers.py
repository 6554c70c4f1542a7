"""Forked worker processes that a stop signal can end at any moment.

:func:`imap` runs a function over calls in worker processes and yields the results in order.
It is written here rather than taken from ``multiprocessing.Pool`` because a pool shares locks
between its workers and its own threads: a worker killed while it sends a result (by
``Pool.terminate()`` after a stop signal, or by a Ctrl-C that reaches the whole process group)
leaves the result queue's lock held, and the pool's terminate then waits for ever. Here each
worker talks to this process over a pipe of its own and shares nothing else, so killing the
workers at any moment leaves nothing held; a worker ignores SIGINT (this process decides) and
ends when its pipe closes, so none outlives this process, even one killed with SIGKILL.

Library: multiprocessing (standard library): Process, Pipe, connection.wait.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import signal
from typing import Any, Callable, Iterable, Iterator

from attnmt.errors import EnvironmentFailure
from attnmt.signals import put_off, stop_point


def _serve(conn, others: list, function: Callable, initializer: Callable | None, initargs: tuple) -> None:
    """A worker's loop: receive the arguments of a call, send back ``(True, result)`` or
    ``(False, exception)``, until the pipe closes. ``others``: the parent's ends of this
    worker's pipe and of those forked before it, inherited by the fork and closed here, so that
    each pipe closes when the parent ends, however it ends."""
    for other in others:
        other.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches every process: the parent stops us
    if initializer is not None:
        initializer(*initargs)
    while True:
        try:
            args = conn.recv()
        except (EOFError, ConnectionResetError):  # the parent closed the pipe, or is gone
            return
        try:
            answer = (True, function(*args))
        except Exception as error:  # raised again in the parent
            answer = (False, error)
        try:
            conn.send(answer)
        except (BrokenPipeError, ConnectionResetError):  # the parent is gone: nobody to answer
            return


def imap(function: Callable, calls: Iterable[tuple], workers: int, initializer: Callable | None = None,
         initargs: tuple = ()) -> Iterator[Any]:
    """``function(*args)`` for each ``args`` of ``calls``, in order, computed in ``workers``
    forked processes (in this process where the platform does not fork). ``calls`` is read as
    workers become free, so at most ``workers`` calls are in flight and ``workers`` results wait
    to be yielded: memory stays bounded however long the stream. ``initializer(*initargs)``
    runs once in each worker. Closing the generator (or a stop) kills the workers.

    Raises:
        Exception: what ``function`` raised in a worker, raised here.
        EnvironmentFailure: a worker ended without answering (killed, out of memory); the
            message names the signal or exit status.
        Interrupted: a stop signal (:mod:`attnmt.signals`) arrived.
    """
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        if initializer is not None:
            initializer(*initargs)
        for args in calls:
            yield function(*args)
        return
    context = multiprocessing.get_context("fork")
    processes, idle = [], []
    connections = []  # the parent's end of each worker's pipe, in the order of `processes`
    try:
        with put_off():  # started whole (each one in `processes` before it can be left behind), then the stop
            for _ in range(workers):
                conn, child = context.Pipe()
                process = context.Process(target=_serve, args=(child, [*idle, conn], function, initializer, initargs),
                                          daemon=True)
                processes.append(process)
                process.start()
                child.close()
                idle.append(conn)
                connections.append(conn)
        stop_point()
        busy: dict[Any, int] = {}  # connection -> index of the call it computes
        done: dict[int, Any] = {}  # index -> result, until its turn
        calls = iter(calls)
        sent = 0  # calls handed to a worker
        turn = 0  # index of the next result to yield
        while True:
            while idle and (args := next(calls, None)) is not None:
                conn = idle.pop()
                conn.send(args)
                busy[conn] = sent
                sent += 1
            if turn in done:
                yield done.pop(turn)
                turn += 1
            elif not busy:
                return
            else:
                for conn in multiprocessing.connection.wait(list(busy)):
                    done[busy.pop(conn)] = _receive(conn, processes[connections.index(conn)])
                    idle.append(conn)
    finally:
        for process in processes:
            process.kill()  # a worker has finished its calls, or its work is no longer wanted
        for process in processes:
            process.join()


def _receive(conn, process) -> Any:
    try:
        ok, value = conn.recv()
    except (EOFError, ConnectionResetError):  # as in _serve: a closed or a reset pipe
        process.join(timeout=5)  # its exit status, which the closed pipe came with
        raise EnvironmentFailure(f"a worker process of attnmt (pid {process.pid}) ended without answering "
                                 f"({_how_it_ended(process.exitcode)}): run the command again; if memory is "
                                 f"short, with fewer --workers") from None
    if not ok:
        raise value
    return value


def _how_it_ended(exitcode: int | None) -> str:
    """A worker's end in words: killed by which signal (out of memory: the kernel's SIGKILL), or its exit status."""
    if exitcode is None:
        return "still running, its pipe closed"
    if exitcode < 0:
        name = signal.Signals(-exitcode).name
        return f"killed by {name}{', e.g. by the kernel for want of memory' if name == 'SIGKILL' else ''}"
    return f"exit status {exitcode}"
