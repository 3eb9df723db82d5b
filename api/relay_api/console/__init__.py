"""The web console at ``/`` and the API's own docs at ``/docs`` and ``/redoc``, all from files in
this package: plain HTML, CSS and JavaScript modules, with uPlot, Swagger UI and ReDoc vendored
under ``static/vendor`` (each with its licence). Nothing is fetched from another site, so both
work on a network without internet.

The console is one page: it talks to the same /v1 API as the SDK, with the key the user signs in
with, and keeps its views in the URL's fragment (``/#/jobs/ft-...``), so the server has one route.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
PREFIX = "/console"
# The console's page may load only this server's files; it talks only to this server. Videos play
# from blob: URLs: a job's files are fetched with the key, which a plain src could not carry.
CONSOLE_POLICY = (
    "default-src 'self'; img-src 'self' data:; media-src 'self' blob:; style-src 'self' 'unsafe-inline'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
)


def install(app: FastAPI) -> None:
    """Serve the console at / (its files under /console) and the docs at /docs and /redoc.
    The app must be made with docs_url=None and redoc_url=None."""
    app.mount(PREFIX, StaticFiles(directory=STATIC), name="console")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/", include_in_schema=False)
    def console() -> FileResponse:
        return FileResponse(
            STATIC / "index.html",
            headers={"cache-control": "no-cache", "content-security-policy": CONSOLE_POLICY},
        )

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            swagger_js_url=f"{PREFIX}/vendor/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{PREFIX}/vendor/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{PREFIX}/favicon.svg",
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            redoc_js_url=f"{PREFIX}/vendor/redoc/redoc.standalone.js",
            redoc_favicon_url=f"{PREFIX}/favicon.svg",
            with_google_fonts=False,
        )
