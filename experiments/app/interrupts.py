"""Ctrl-C that is not lost: an interrupt raised where Python ignores exceptions is raised again.

Python runs a signal's handler in the main thread between two bytecodes of whatever runs there,
and that may be a weakref callback or a `__del__` run as an object is freed (under W&B, a
finished thread leaving `threading._dangling`, a `WeakSet`), where an exception cannot
propagate: Python prints `Exception ignored in: ...` and goes on. The sweep's `Interrupted`
(experiments/app/sweep.py) was so dropped, and every job ran (4 of 19 Ctrl-Cs under
the default logger). A handler made by `raising` is raised again until it propagates: the
`sys.unraisablehook` installed with it takes such an interrupt (silently) and asks a helper
thread to send SIGINT to the main thread again (`signal.pthread_kill`) every `RETRY_S`,
until the handler raises it outside the hook (or `MAX_RETRIES`, or the handler changed, as the
end of a multirun puts back the default one). Every other unraisable exception goes to the hook
there was before. An interrupt that another error replaced as it propagated (a `finally` that
failed under it, as OmegaConf's can while Hydra composes a job) is kept: `raised()` is the last
one a handler raised, for the entry point to end the sweep as interrupted all the same.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

RETRY_S = 0.05
MAX_RETRIES = 200  # 10 s: an interrupt that is dropped every time is given up

_pending = threading.Event()  # an interrupt was dropped and is to be raised again
_lock = threading.Lock()
_previous_hook: Callable[[Any], None] | None = None
_helper: threading.Thread | None = None
_raised: BaseException | None = None  # the last interrupt a `raising` handler raised


def raising(make: Callable[[], BaseException]) -> Callable[[int, FrameType | None], None]:
    """A SIGINT handler that raises `make()`, raised again wherever Python would drop it."""

    global _raised

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        global _raised
        if _in_hook(frame):
            return  # `_pending` stays set: the helper signals again in RETRY_S
        _pending.clear()
        _raised = make()
        raise _raised

    on_sigint.raised_again = True  # type: ignore[attr-defined]
    _raised = None
    _install()
    return on_sigint


def raised() -> BaseException | None:
    """The interrupt the last `raising` handler raised (None: none since it was made), whether
    or not it propagated."""
    return _raised


def _ours(handler: Any) -> bool:
    return getattr(handler, "raised_again", False)


def _hook(unraisable: Any) -> None:
    """sys.unraisablehook: an interrupt of a `raising` handler is raised again, not printed."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _ours(
        signal.getsignal(signal.SIGINT)
    ):
        _pending.set()
        return
    (_previous_hook or sys.__unraisablehook__)(unraisable)


def _in_hook(frame: FrameType | None) -> bool:
    """Whether `frame` runs in `_hook`, where a raised exception would be dropped too."""
    while frame is not None:
        if frame.f_code is _hook.__code__:
            return True
        frame = frame.f_back
    return False


def _retry() -> None:
    """The helper thread: while an interrupt is pending, signal the main thread again."""
    while True:
        _pending.wait()
        for _ in range(MAX_RETRIES):
            if not (_pending.is_set() and _ours(signal.getsignal(signal.SIGINT))):
                break
            # A real SIGINT to the main thread, which also ends a blocking call there (EINTR),
            # as the user's did; `_thread.interrupt_main` would wait for that call to return.
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(RETRY_S)
        _pending.clear()


def _install() -> None:
    """The hook and the helper thread, once per process."""
    global _previous_hook, _helper
    with _lock:
        if sys.unraisablehook is not _hook:
            _previous_hook = sys.unraisablehook
            sys.unraisablehook = _hook
        if _helper is None:
            _helper = threading.Thread(target=_retry, name="attnbench-interrupts", daemon=True)
            _helper.start()


EXIT_GRACE_S = 10.0  # an interrupted process's exit (threads joined, atexit hooks) within this


def exit_within(code: int, grace_s: float = EXIT_GRACE_S) -> None:
    """`sys.exit(code)`, but if the exit has not ended the process after `grace_s` (a thread or
    an atexit hook that waits on something the Ctrl-C broke), every thread's stack to stderr
    and `os._exit(code)`: a Ctrl-C ends the process."""

    def stalled() -> None:
        time.sleep(grace_s)
        print(f"\nexit stalled for {grace_s:g} s; ending now. Threads:", file=sys.stderr)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)

    threading.Thread(target=stalled, name="attnbench-exit", daemon=True).start()
    sys.exit(code)
