"""A job run in a worker process (the joblib launcher's) ends when its parent dies.

`kill -9` of a sweep's process left its joblib workers running: each finished its job and added
records for 20 s afterwards, colliding with a re-run. The app marks its own process
at the start (`mark_launcher`: its pid in the environment, which the workers inherit); a job that
runs in another process (`exit_with_parent`, called at each job's start) starts one daemon
thread per process that checks every `POLL_S` that its parent is still the one it started with,
and ends the process at once (`os._exit`, no record written) when it is not: the parent died
and the worker was handed to init (or a subreaper). Polling, not Linux's PR_SET_PDEATHSIG:
that fires when the parent *thread* that started the worker ends, and loky starts its workers
from a helper thread. The launching process itself is never watched: a sweep started with
nohup outlives its shell.
"""

from __future__ import annotations

import os
import threading
import time

VARIABLE = "ATTNBENCH_LAUNCHER_PID"
POLL_S = 0.2
_watching: int | None = None  # the pid whose parent a thread watches
_lock = threading.Lock()


def mark_launcher() -> None:
    """Mark this process as the sweep's: jobs in other processes then watch their parent."""
    os.environ[VARIABLE] = str(os.getpid())


def in_worker() -> bool:
    """Whether this process is a worker of a marked launcher, not the launcher itself."""
    launcher = os.environ.get(VARIABLE)
    return bool(launcher) and launcher != str(os.getpid())


def exit_with_parent() -> None:
    """In a worker process, end the process when its parent dies (idempotent per process)."""
    global _watching
    if not in_worker():
        return
    with _lock:
        if _watching == os.getpid():
            return
        _watching = os.getpid()
    parent = os.getppid()
    if parent == 1:  # already orphaned before the job started
        os._exit(1)
    threading.Thread(
        target=_watch, args=(parent,), name="attnbench-parent-watch", daemon=True
    ).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os._exit(1)  # the parent is gone: no record, nothing more to do
