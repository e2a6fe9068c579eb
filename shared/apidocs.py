"""/docs (Swagger UI) and /redoc served with their scripts and styles from the package, so the API's
pages work with no network: FastAPI's defaults load them from a CDN. The coordinator and the worker
both mount them. The vendored files and their licences: shared/vendor/{swagger_ui,redoc}."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

VENDOR_DIR = Path(__file__).resolve().parent / "vendor"
ASSETS = "/api-docs-assets"
FAVICON = "data:,"  # no icon rather than one fetched from the internet


def mount_api_docs(app: FastAPI) -> None:
    """/docs and /redoc on `app` (created with docs_url=None, redoc_url=None) from local assets."""
    app.mount(ASSETS, StaticFiles(directory=VENDOR_DIR), name="api-docs-assets")
    title = app.title

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{title}: API",
            swagger_js_url=f"{ASSETS}/swagger_ui/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger_ui/swagger-ui.css",
            swagger_favicon_url=FAVICON,
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{title}: API",
            redoc_js_url=f"{ASSETS}/redoc/redoc.standalone.js",
            redoc_favicon_url=FAVICON,
            with_google_fonts=False,
        )
