"""Objects bound to an event loop (asyncio events and tasks, anyio limiters), one per running loop.

The app's lifespan runs on one loop, but a test client used without its context manager runs each
request on a loop of its own; an object made on one loop cannot be awaited on another. Made here
when first asked for on a loop, so that no caller needs a fallback for an app started without its
lifespan.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """One `make()` per running event loop, made on first use on that loop."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._made: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def get(self) -> T:
        """The running loop's object (call it on the loop)."""
        loop = asyncio.get_running_loop()
        made = self._made.get(loop)
        if made is None:
            made = self._made[loop] = self._make()
        return made
