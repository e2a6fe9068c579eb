"""A cross-process limit on concurrent training: N lock files, one held per training worker."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def training_slot(directory: Path | None, slots: int, stop: threading.Event | None = None) -> Iterator[int]:
    """Hold one of `slots` file locks in `directory` (no-op when directory is None); waits for a free one."""
    if directory is None or slots <= 0:
        yield -1
        return
    directory.mkdir(parents=True, exist_ok=True)
    while True:
        for i in range(slots):
            fd = os.open(directory / f"slot-{i}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield i
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        if stop is not None and stop.is_set():
            raise InterruptedError("stopping while waiting for a training slot")
        time.sleep(0.2)
