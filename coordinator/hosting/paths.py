"""The API's paths, each spelled once: the routers' prefixes and the upload routes, whose bodies the
size-limit middleware allows up to FEDPROMPT_MAX_UPLOAD_BYTES and whose answers the metrics count.

It imports nothing of the coordinator and sits below api/, so that the metrics read the upload
route without importing the API."""

from __future__ import annotations

import re

API = "/api/v1"
FEDERATIONS = f"{API}/federations"
FEDERATION = FEDERATIONS + "/{fid}"
# The two routes that take a safetensors body, relative to FEDERATION.
UPDATE = "/rounds/{number}/update"
INITIAL_PROMPT = "/prompts/0"
UPLOAD_ROUTE = FEDERATION + UPDATE
INITIAL_PROMPT_ROUTE = FEDERATION + INITIAL_PROMPT


def template_pattern(*templates: str) -> re.Pattern[str]:
    """A regular expression of the request paths that match any of the route templates (a trailing
    slash allowed), each {parameter} one path segment."""
    alternatives = (re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(t)) for t in templates)
    return re.compile(f"^(?:{'|'.join(alternatives)})/?$")


UPLOAD_PATHS = template_pattern(UPLOAD_ROUTE, INITIAL_PROMPT_ROUTE)
