"""The dashboard's web application (Starlette): pages, a JSON API, sample images, /metrics.

Read-only: every route is a GET except the login form. The pages are static HTML whose
script polls the JSON API and redraws, so they update without a reload.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from thrift_trainer.dashboard import run_files
from thrift_trainer.dashboard.access import Access
from thrift_trainer.dashboard.comparison import ComparisonError, comparison, parse_run_ids
from thrift_trainer.dashboard.views import UnknownRunError, Views

STATIC = Path(__file__).resolve().parent / "static"
NO_STORE = {"Cache-Control": "no-store"}  # live data: a browser must not keep old answers


def build_app(views: Views, registry: CollectorRegistry, access: Access) -> Starlette:
    def runs_api(request: Request) -> Response:
        return _json({"runs": views.runs(), **views.leadership()})

    def run_api(request: Request) -> Response:
        try:
            return _json(views.run(request.path_params["run_id"]))
        except UnknownRunError:
            return _not_found("no such run")

    def compare_api(request: Request) -> Response:
        try:
            run_ids = parse_run_ids(request.query_params.get("runs"))
        except ComparisonError as exc:
            return PlainTextResponse(f"400 {exc}\n", status_code=400)
        try:
            return _json(views.cached(("compare", *run_ids), lambda: comparison(
                views.coordinator.settings.run_root, run_ids)))
        except ComparisonError as exc:
            return _not_found(str(exc))

    def sample(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            views.run(run_id)  # a known run: its id is safe as a folder name
        except UnknownRunError:
            return _not_found("no such run")
        path = run_files.sample_path(views.run_dir(run_id), request.path_params["round"])
        if not path.is_file():
            return _not_found("no sample grid for that round")
        return FileResponse(path, media_type="image/png")

    def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST,
                        headers=NO_STORE)

    def page(name: str) -> Any:
        def serve(request: Request) -> Response:
            return FileResponse(STATIC / name, media_type="text/html", headers=NO_STORE)
        return serve

    routes = [
        Route("/", page("index.html")),
        Route("/runs/{run_id}", page("run.html")),
        Route("/compare", page("compare.html")),
        Route("/api/runs", runs_api),
        Route("/api/runs/{run_id}", run_api),
        Route("/api/compare", compare_api),
        Route("/api/runs/{run_id}/samples/{round:int}", sample),
        Route("/metrics", metrics),
        Route("/login", access.login, methods=["GET", "POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes,
                     middleware=[Middleware(BaseHTTPMiddleware, dispatch=_guard(access))])


def _guard(access: Access) -> Any:
    async def dispatch(request: Request, call_next: RequestResponseEndpoint) -> Response:
        if request.method not in ("GET", "HEAD") and request.url.path != "/login":
            return PlainTextResponse("405 the dashboard is read-only\n", status_code=405)
        if (signed_in := access.token_in_query(request)) is not None:
            return signed_in
        if not access.allowed(request):
            return access.refuse(request)
        return await call_next(request)
    return dispatch


def _json(data: Any) -> Response:
    return JSONResponse(_plain(data), headers=NO_STORE)


def _not_found(message: str) -> Response:
    return PlainTextResponse(f"404 {message}\n", status_code=404)


def _plain(value: Any) -> Any:
    """`value` with NaN and infinities as None: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
