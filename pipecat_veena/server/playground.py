"""The playground page at ``/``: plain HTML, JS and CSS shipped in the package (no build step).

The page speaks through the server's own APIs (``/v1/audio/voices``, the streaming WebSocket),
and its Content-Security-Policy lets it load and connect to nothing but the server it came from.
Its files live in ``static/`` next to this module and are served under ``/playground/``.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

#: The page's files: index.html, playground.js, player-worklet.js, playground.css, favicon.svg.
STATIC_DIR = Path(__file__).resolve().parent / "static"
#: Where the page's scripts, worklet and style sheet are served.
ASSETS_PATH = "/playground"
#: Same origin only: scripts, the worklet, styles, fetches and the WebSocket.
CSP = (
    "default-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

router = APIRouter()


@router.get("/", include_in_schema=False)
async def playground() -> Response:
    """The playground page (no API key needed: the page asks for one when the server has keys)."""
    return FileResponse(
        STATIC_DIR / "index.html",
        media_type="text/html; charset=utf-8",
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
    )


@router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> Response:
    """The page's icon, also where browsers and tools look for one without a ``<link>``."""
    return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")


def add_playground(app: FastAPI) -> None:
    """Serve the playground at ``/`` and its files under ``ASSETS_PATH``."""
    app.include_router(router)
    app.mount(ASSETS_PATH, StaticFiles(directory=STATIC_DIR), name="playground")
