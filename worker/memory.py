"""Give the memory a task freed back to the system when it ends (glibc's `malloc_trim`).

A training or evaluation task allocates its activations, gradients and optimiser state and frees
them when it ends, but glibc keeps freed pages in its heaps for later: a process that serves many
clients, one task after another, holds on to what its largest tasks ever needed. `malloc_trim(0)`
returns the free pages of every heap to the system. Where the C library is not glibc it does not
exist, and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Return the process's free heap pages to the system; whether the C library could."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
