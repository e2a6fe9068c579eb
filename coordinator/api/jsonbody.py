"""JSON request bodies parsed within limits (shared/jsonlimits.py) by every route that takes one.

FastAPI parses a JSON body with ``await request.json()``; the routers of this API are built with
``BoundedJSONRoute``, whose requests parse it with ``jsonlimits.loads`` instead: a body nested
deeper than 64 levels, a number longer than 400 characters, a non-finite number or a lone
surrogate is answered 400 problem+json before any model sees it (not a ``RecursionError`` or a
database error later); a body that is not JSON at all is answered 422 as FastAPI does. A number
without a fraction is read as an integer whichever way it is written (``5.0`` is 5, as in JSON
Schema), so the request models can be strict (``true`` is not 1, ``"5"`` is not 5) and still take
every number their schema calls an integer.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from fedprompt.coordinator.api.fastpath import fast_path_of
from fedprompt.shared import jsonlimits
from fedprompt.shared.logs import bind_route_context


class BoundedJSONRequest(Request):
    """A request whose JSON body is parsed within jsonlimits' limits."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = jsonlimits.loads(body, what="the request body", integral_floats_as_int=True)
            except jsonlimits.JSONSyntaxError as exc:
                raise exc.decode_error from None  # FastAPI answers it as before (422 json_invalid)
            except jsonlimits.JSONLimitError as exc:
                raise HTTPException(400, f"the request body could not be parsed: {exc}") from None
        return self._json


class BoundedJSONRoute(APIRoute):
    """The coordinator's route class: the request body's JSON parsed by BoundedJSONRequest, the
    path's ids bound into the log context before any dependency runs (here rather than as an
    app-wide dependency, which FastAPI would solve anew on every request), and a request offered to
    the endpoint's fast path first where it has one (fastpath.py)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        self.fast_path = fast_path_of(self.endpoint)

        async def bounded(request: Request) -> Response:
            bind_route_context(request.path_params)
            bounded_request = BoundedJSONRequest(request.scope, request.receive)
            fast = self.fast_path
            # one request object for both: a body the fast path read is FastAPI's to read again
            if fast is not None and (response := await fast(bounded_request)) is not None:
                return response
            return await handler(bounded_request)

        return bounded
