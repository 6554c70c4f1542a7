"""A clean stop on SIGINT and SIGTERM, shared by every long loop (preparing data, planning
epochs, training, validation, distillation).

:class:`StopSignals` catches both signals while it is entered. By default the first one only
sets a flag (:attr:`StopSignals.received`) for a loop to act on at a safe point (the trainer's
update boundary); inside :meth:`StopSignals.raising` it raises :class:`Interrupted` at once,
for work that writes nothing until it is done or writes through a staging directory or an
atomic rename (an exception leaves no half-written file). A second SIGINT raises
``KeyboardInterrupt`` at once; other repeated signals are ignored, so that cleanup runs.

Like ``KeyboardInterrupt``, :class:`Interrupted` is not an ``Exception``: an ``except
Exception`` in library code does not swallow it. Python itself swallows what a ``__del__``
method or a callback at ``fork`` raises; so long loops also call :func:`stop_point` once per
unit of work, which raises the stop a swallowed raise left behind or :func:`put_off` held
back (and while a :class:`StopSignals` is entered, ``sys.unraisablehook`` prints nothing of
such a raise: the stop ends with one line). A signal that arrives inside the ``logging`` module (whose callback
at ``fork`` would leave its lock held if the raise skipped the release) is sent again 50 ms
later instead, to raise outside it.

A process forked while the handlers are installed (a worker) does not inherit the stop
(``os.register_at_fork`` puts the default actions back in the child at once): there a
signal takes its default action, whatever the worker is doing.

Library: signal, threading (standard library).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, Iterator

log = logging.getLogger(__name__)

_DEFER_IN = {logging.__file__}  # code a raise must not interrupt: the stop is sent again shortly
RESEND_SECONDS = 0.05


class Interrupted(BaseException):
    """A stop signal ended the work; :attr:`exit_code` is the conventional 128 + its number.
    A ``BaseException``, as ``KeyboardInterrupt`` is (module docstring)."""

    def __init__(self, signal_name: str, message: str | None = None):
        self.signal_name = signal_name
        super().__init__(message or f"stopped by {signal_name}; nothing half-written was kept")

    @property
    def exit_code(self) -> int:
        return 128 + signal.Signals[self.signal_name].value


class StopSignals:
    """Catch SIGINT and SIGTERM (module docstring). Use as a context manager; the previous
    handlers come back at exit. Outside the main thread (where Python allows no handlers) it
    does nothing.

    Attributes:
        received: the first signal's name ('SIGINT', 'SIGTERM'), or None.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, raising: bool = False) -> None:
        self.received: str | None = None
        self._raising = raising
        self._owner = os.getpid()
        self._previous: dict[int, Any] = {}
        self._previous_hook: Any = None
        self._deferred = False  # a raise put off (module docstring): the signal is sent again
        self._quiet = False  # inside put_off(): the flag only, without the checkpoint message

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._owner:  # a forked worker: the default action (termination)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        name, resent = signal.Signals(signum).name, self._deferred
        if self.received is not None and not resent:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.received = self.received or name
        if self._raising:
            self._deferred = frame is not None and frame.f_code.co_filename in _DEFER_IN
            if self._deferred:
                threading.Timer(RESEND_SECONDS, self._resend, (signum,)).start()
                return
            raise Interrupted(self.received)
        if resent:
            self._deferred = False
            return
        if self._quiet:
            return
        log.warning("%s received: stopping at the next safe point with a resumable checkpoint", name)

    def _resend(self, signum: int) -> None:
        """Send a put-off signal again, unless the stop has been handled and the handlers are gone
        (the default action would then kill the process that is exiting cleanly)."""
        if self in _entered:
            os.kill(os.getpid(), signum)

    def check(self) -> None:
        """Raise :class:`Interrupted` if a signal has been received.

        Raises:
            Interrupted: a signal was received (its name in the exception).
        """
        if self.received is not None:
            raise Interrupted(self.received)

    @contextlib.contextmanager
    def raising(self) -> Iterator["StopSignals"]:
        """Inside the block a signal raises :class:`Interrupted` at once (as does one received
        before it); the flag-only behaviour comes back after it.

        Raises:
            Interrupted: a signal arrived before or during the block.
        """
        self.check()
        before, self._raising = self._raising, True
        try:
            yield self
        finally:
            self._raising = before

    def __enter__(self) -> "StopSignals":
        try:
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        except ValueError:  # not the main thread
            self._previous.clear()
            return self
        if not _fork_hook:  # once per process, at the first use (no import-time side effect)
            os.register_at_fork(after_in_child=_defaults_in_child)
            _fork_hook.append(True)
        _entered.append(self)
        self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def _unraisable(self, info: Any) -> None:
        """``sys.unraisablehook``: a swallowed :class:`Interrupted` is left to :func:`stop_point`,
        silently; anything else goes to the previous hook."""
        if not isinstance(info.exc_value, Interrupted):
            self._previous_hook(info)

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
        if self in _entered:
            _entered.remove(self)
            sys.unraisablehook, self._previous_hook = self._previous_hook, None


_entered: list[StopSignals] = []  # the instances whose handlers are installed, innermost last
_fork_hook: list[bool] = []  # [True] once _defaults_in_child is registered with os.register_at_fork


def _defaults_in_child() -> None:
    """In a process just forked while handlers are installed (a worker pool): the default
    actions at once, so that a signal from its parent ends the worker in the kernel,
    whatever Python code (or blocking call) the worker is in."""
    if _entered:
        for s in StopSignals.SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        _entered.clear()



@contextlib.contextmanager
def put_off() -> Iterator[None]:
    """Inside the block a stop signal only sets the flag of the entered :class:`StopSignals`
    in raising mode; the stop is raised at the next :func:`stop_point` after the block. For
    code that an exception at an arbitrary bytecode would leave broken, such as starting worker
    processes (one forked but not yet recorded for the cleanup would outlive this process)."""
    stops = [s for s in _entered if s._raising]
    for s in stops:
        s._raising, s._quiet = False, True
    try:
        yield
    finally:
        for s in stops:
            s._raising, s._quiet = True, False


def stop_point() -> None:
    """A safe point of a long loop (once per chunk of work): raise the stop that a signal
    asked of an entered :class:`StopSignals` in raising mode, if its raise was swallowed.
    Nothing otherwise, and nothing in flag-only mode, whose owner acts on the flag itself.

    Raises:
        Interrupted: such a signal was received.
    """
    for stop in _entered:
        if stop.received is not None and stop._raising:
            raise Interrupted(stop.received)
