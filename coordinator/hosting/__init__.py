"""How the coordinator is served over HTTP: the uvicorn server with its connection limits (server.py),
the API's paths (paths.py), the per-address rate limits (ratelimit.py) and the caps on request bodies
in progress (inflight.py)."""
