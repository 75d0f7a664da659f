"""The HTTP side of `vitlab serve`: a FastAPI app around an `Engine`.

    POST /predict        images (multipart `file` fields, or the raw bytes as the body) ->
                         top-k classes per image; ?attention=true adds the rollout (Fig. 6)
    GET  /health         200 once the model is loaded and warmed up, 503 before
    GET  /info           the model's config, classes and preprocessing; the server's limits
    GET  /metrics        Prometheus text format
    GET  /docs           the OpenAPI page (bundled Swagger UI: no CDN)
    GET  /               a page to try the model in a browser (bundled, offline)

Every refusal is a JSON body {"error": ..., "status": ...} with a 4xx status. Decoding and
preprocessing run on a few worker threads (one per core), the model on its own single thread
(`Batcher`), so the event loop only moves bytes.
"""

# No `from __future__ import annotations` here: FastAPI reads the handlers' annotations, and
# the classes they name (Request) are imported inside create_app, where postponed strings
# could not be resolved.
import asyncio
import contextlib
import hmac
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from typing import Any, Callable, Optional

import numpy as np

from vitlab.analysis.overlay import COLOR_STOPS, overlay_png_base64
from vitlab.config.fields import is_digits
from vitlab.config.serve import ServeConfig
from vitlab.serve.batcher import Batcher
from vitlab.serve.engine import Engine, Looked, Prepared, UploadError
from vitlab.serve.metrics import Metrics

log = logging.getLogger("vitlab.serve")

# The page's files (package data) and their types; nothing else is served from the package.
PAGE_FILES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
# The page may load nothing from elsewhere: what it needs ships with vitlab.
PAGE_POLICY = ("default-src 'self'; img-src 'self' data: blob:; script-src 'self'; style-src 'self'; "
               "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")

_BINARY = {"type": "string", "format": "binary"}
PREDICT_BODY = {"requestBody": {
    "required": True,
    "description": "One or more images as multipart `file` fields (`curl -F file=@cat.jpg`), or one image "
    "as the raw request body (`curl --data-binary @cat.jpg`). PNG, JPEG, GIF, BMP, TIFF, WebP, PPM.",
    "content": {
        "multipart/form-data": {"schema": {"type": "object", "required": ["file"],
                                           "properties": {"file": {"type": "array", "items": _BINARY}}}},
        "application/octet-stream": {"schema": _BINARY}, "image/*": {"schema": _BINARY},
    },
}}
_ERROR = {"content": {"application/json": {"example": {"error": "what was wrong, and the fix", "status": 400}}}}
PREDICT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Per image: the top-k classes; with attention=true the rollout too.",
          "content": {"application/json": {"example": {
              "model": "ViT-B/16", "precision": "fp32", "time_ms": 41.2,
              "results": [{"file": "cat.jpg", "width": 640, "height": 480, "batch_size": 3,
                           "predictions": [{"class": "tabby cat", "index": 281, "probability": 0.83}],
                           "attention": {"grid": [[0.12, 0.5], [0.33, 1.0]], "overlay_png": "iVBORw0KGgo..."}}]}}}},
    400: {"description": "Empty upload, no `file` field, too many files", **_ERROR},
    401: {"description": "The server needs an API key (--api-key) and got none or a wrong one", **_ERROR},
    413: {"description": "More bytes than --max-upload-mb", **_ERROR},
    415: {"description": "Not an image the server reads", **_ERROR},
    422: {"description": "An image with too many pixels (a decompression bomb), damaged data, a bad parameter", **_ERROR},
    503: {"description": "The model is still warming up", **_ERROR},
}


@dataclass
class ServerState:
    ready: bool = False
    stopping: bool = False
    failed: str = ""
    batchers: dict[str, Batcher] = field(default_factory=dict)
    # Decoding and drawing: as many threads as cores, no more. More would not be faster, and
    # each decode may hold an image of up to max_pixels, so this also bounds that memory.
    workers: Optional[ThreadPoolExecutor] = None

    async def in_worker(self, fn, *args):
        assert self.workers is not None, "the app has not started"
        return await asyncio.get_running_loop().run_in_executor(self.workers, partial(fn, *args))


def error_body(status: int, message: str) -> dict:
    return {"error": message, "status": status}


# The upload limit and the request metrics, below FastAPI ------------------------------------
class Guard:
    """ASGI middleware: refuses a body over the limit (from its Content-Length before reading a
    byte, or as soon as a streamed body passes it) and counts every response in the metrics."""

    def __init__(self, app, limit: int, metrics: Metrics):
        self.app, self.limit, self.metrics = app, limit, metrics
        self.too_large = (f"the request is larger than the server's limit of {limit / 2**20:g} MiB (--max-upload-mb); "
                          "send a smaller image or fewer images per request")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), 500

        async def send_counted(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            headers = dict(scope.get("headers") or [])
            declared = headers.get(b"content-length", b"").decode("latin-1")
            if is_digits(declared) and int(declared) > self.limit:
                await _send_json(send_counted, 413, error_body(413, self.too_large), close=True)
                return
            await self.app(scope, self._limited(receive), send_counted)
        finally:
            self.metrics.in_flight.dec()
            self.metrics.observe_request(scope["path"], status, time.perf_counter() - started)

    def _limited(self, receive):
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise UploadError(413, self.too_large)  # answered by the app's UploadError handler
            return message

        return limited


async def _send_json(send, status: int, payload: dict, close: bool = False) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # the unread body is still on the wire: this connection cannot carry another request
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# Requests -> images -> JSON ---------------------------------------------------------------
async def read_uploads(request, config: ServeConfig) -> list[tuple[str, bytes]]:
    """[(name, bytes)] from multipart `file` fields, or the whole body as one image."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        return [("body", await request.body())]
    form = await request.form(max_files=config.max_files, max_fields=config.max_files + 16)
    try:
        files = [v for k, v in form.multi_items() if k == "file"]
        if not files:
            fields = sorted({k for k, _ in form.multi_items()})
            raise UploadError(400, f"the form has no `file` field (it has: {', '.join(fields) or 'nothing'}); send the image as "
                                   "`file`, e.g. curl -F file=@cat.jpg")
        if any(isinstance(f, str) for f in files):
            raise UploadError(400, "a `file` field holds text, not a file; attach the file (curl -F file=@cat.jpg)")
        return [(f.filename or f"file {i + 1}", await f.read()) for i, f in enumerate(files)]
    finally:
        await form.close()


def prepare_upload(engine: Engine, config: ServeConfig, name: str, data: bytes, display: bool, many: bool) -> Prepared:
    try:
        return engine.prepare(data, config.max_pixels, display)
    except UploadError as e:
        raise UploadError(e.status, f"{name}: {e}" if many else str(e)) from None


def result_entry(engine: Engine, name: str, prepared: Prepared, output: tuple[Any, int], k: int, heads: bool) -> dict:
    result, batch_size = output
    looked = isinstance(result, Looked)
    probs = result.probs if looked else result
    entry: dict[str, Any] = {"file": name, "width": prepared.width, "height": prepared.height, "batch_size": batch_size,
                             "predictions": [{**p, "probability": round(p["probability"], 6)} for p in engine.top_k(probs, k)]}
    if looked:
        assert prepared.display is not None
        entry["attention"] = {"grid": _rounded(result.rollout), "overlay_png": overlay_png_base64(prepared.display, result.rollout)}
        if heads:
            entry["attention"]["heads"] = _rounded(result.heads)  # [layer][head][row][col]
    return entry


def _rounded(a: np.ndarray) -> list:
    """Nested lists of 4-decimal floats (in float64, so JSON shows 0.1234, not 0.12340000271)."""
    return np.round(a.astype(np.float64), 4).tolist()


def header_bytes(value: str) -> bytes:
    """A header value as the bytes that came over the wire. The ASGI server decodes header
    bytes as Latin-1, one character per byte, so encoding them back as Latin-1 restores the
    raw bytes (a non-ASCII key sent by curl or by the page: its UTF-8)."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:  # not from the wire (a test client's str): its UTF-8
        return value.encode("utf-8")


def _check_key(expected: str):
    """A FastAPI dependency for /predict: the key in X-API-Key, or as Authorization: Bearer."""
    from fastapi import HTTPException, Request, Security
    from fastapi.security import APIKeyHeader

    header = APIKeyHeader(name="X-API-Key", auto_error=False, description="the server's --api-key")
    secret = expected.encode("utf-8")  # the key as the bytes a client sends: curl sends UTF-8

    async def check(request: Request, key: Optional[str] = Security(header)) -> None:
        bearer = request.headers.get("authorization", "")
        given = key or (bearer[7:].strip() if bearer.lower().startswith("bearer ") else "")
        if not given:
            raise HTTPException(401, "this server needs an API key: send it as the X-API-Key header")
        if not hmac.compare_digest(header_bytes(given), secret):
            raise HTTPException(401, "the API key is wrong")

    return check


# The app ---------------------------------------------------------------------------------
def create_app(engine: Engine, config: ServeConfig, on_ready: Optional[Callable[[float], None]] = None):
    """The FastAPI app serving `engine`. The model warms up in the background once the app
    starts; `/health` says when it is ready and `on_ready(seconds)` is called then."""
    # fastapi and its kin are the serve extra's: imported where used, so vitlab imports without them.
    from fastapi_offline import FastAPIOffline

    state, metrics = ServerState(), Metrics(engine.config.name, engine.precision)
    app = FastAPIOffline(title="vitlab serve", version="1",
                         summary=f"{engine.config.name} ({engine.precision}): image classification with attention maps",
                         lifespan=partial(_lifespan, engine=engine, config=config, state=state, metrics=metrics, on_ready=on_ready))
    app.state.server = state
    app.add_middleware(Guard, limit=config.max_upload_bytes, metrics=metrics)
    _add_error_handlers(app)
    _add_page(app)
    _add_status(app, engine, config, state, metrics)
    _add_predict(app, engine, config, state)
    return app


def _add_status(app, engine: Engine, config: ServeConfig, state: ServerState, metrics: Metrics) -> None:
    """/health, /info and /metrics."""
    from fastapi.responses import JSONResponse, Response  # the serve extra's

    @app.get("/health", summary="200 once the model is loaded and warmed up, 503 before")
    async def health():
        if state.ready:
            return {"status": "ready", "model": engine.config.name, "precision": engine.precision}
        return JSONResponse({"status": state.failed or ("shutting down" if state.stopping else "warming up")}, 503)

    @app.get("/info", summary="The model's config, classes and preprocessing; the server's limits")
    async def info():
        names = ("max_batch", "max_wait_ms", "max_upload_mb", "max_files", "max_pixels")
        limits: dict[str, Any] = {k: getattr(config, k) for k in names}
        limits["api_key_required"] = config.api_key is not None
        return {**engine.describe(), "server": limits, "colormap": [[at, list(rgb)] for at, rgb in COLOR_STOPS]}

    @app.get("/metrics", summary="Prometheus text format: requests, errors, latency, batch sizes")
    async def prometheus():
        body, kind = metrics.render()
        return Response(body, media_type=kind)


def _add_predict(app, engine: Engine, config: ServeConfig, state: ServerState) -> None:
    # The serve extra's; `Request` and `Query` must be real classes when FastAPI reads the signature.
    from fastapi import Depends, HTTPException, Query, Request

    @app.post("/predict", summary="Classify images", openapi_extra=PREDICT_BODY, responses=PREDICT_RESPONSES,
              dependencies=[Depends(_check_key(config.api_key))] if config.api_key is not None else [])
    async def predict(request: Request,
                      top_k: int = Query(5, ge=1, le=100_000, description="classes per image (at most the model's)"),
                      attention: bool = Query(False, description="add the attention rollout: a PNG overlay (base64) and the grid"),
                      heads: bool = Query(False, description="with attention: also each layer's and head's map from the class token")):
        started = time.perf_counter()
        if not state.ready:
            raise HTTPException(503, state.failed or "the model is still warming up; retry when GET /health is 200")
        if attention and not engine.has_attention:
            raise HTTPException(400, f"{engine.config.name} is a BiT ResNet: it has no attention to map; "
                                     "ask without attention=true")
        uploads = await read_uploads(request, config)
        many = len(uploads) > 1
        prepared = await asyncio.gather(*(state.in_worker(prepare_upload, engine, config, n, d, attention, many) for n, d in uploads))
        batcher = state.batchers["attention" if attention else "classify"]
        outputs = await asyncio.gather(*(batcher.submit(p.tensor) for p in prepared))
        k = min(top_k, engine.config.num_classes)
        entries = [partial(result_entry, engine, n, p, o, k, heads) for (n, _), p, o in zip(uploads, prepared, outputs, strict=True)]
        if attention:  # drawing and encoding the overlays is CPU work: off the event loop
            results = await state.in_worker(lambda: [make() for make in entries])
        else:
            results = [make() for make in entries]
        took = round(1000 * (time.perf_counter() - started), 2)
        return {"model": engine.short_name, "precision": engine.precision, "time_ms": took, "results": results}


def _add_error_handlers(app) -> None:
    """Every refusal as {"error": ..., "status": ...}."""
    from fastapi.exceptions import RequestValidationError  # the serve extra's
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    @app.exception_handler(UploadError)
    async def refused(request, e: UploadError):
        return JSONResponse(error_body(e.status, str(e)), e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request, e):
        headers = getattr(e, "headers", None)
        return JSONResponse(error_body(e.status_code, str(e.detail)), e.status_code, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(request, e):
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors())
        return JSONResponse(error_body(422, problems), 422)

    @app.exception_handler(Exception)
    async def internal(request, e):  # a bug: logged in full, answered without the details
        log.exception("internal error on %s", request.url.path)
        return JSONResponse(error_body(500, "internal error; the server log has the details"), 500)


def _add_page(app) -> None:
    """`/` and its files, read once from the package data."""
    from fastapi.responses import Response  # the serve extra's

    folder = resources.files("vitlab.serve").joinpath("static")
    files = {name: folder.joinpath(name).read_bytes() for name in PAGE_FILES}
    headers = {"Content-Security-Policy": PAGE_POLICY, "X-Content-Type-Options": "nosniff"}

    def page_file(name: str):
        if name not in files:
            return Response(json.dumps(error_body(404, f"no page file {name!r}")), 404, media_type="application/json")
        return Response(files[name], media_type=PAGE_FILES[name], headers=headers)

    app.get("/", include_in_schema=False)(lambda: page_file("index.html"))
    app.get("/static/{name}", include_in_schema=False)(page_file)


@contextlib.asynccontextmanager
async def _lifespan(app, engine: Engine, config: ServeConfig, state: ServerState, metrics: Metrics, on_ready=None):
    """Start the batchers and the warm-up; on shutdown (after uvicorn has let the requests in
    flight finish) stop them and the model's thread."""
    executor = ThreadPoolExecutor(1, thread_name_prefix="vitlab-model")  # one model copy, one batch at a time
    state.workers = ThreadPoolExecutor(max(2, os.cpu_count() or 1), thread_name_prefix="vitlab-decode")
    for kind, run in (("classify", engine.classify), ("attention", engine.look)):
        wait = config.max_wait_ms / 1000
        batcher = Batcher(run, executor, config.max_batch, wait, partial(metrics.observe_batch, kind))
        batcher.start()
        state.batchers[kind] = batcher
    warming = asyncio.get_running_loop().create_task(_warm_up(engine, config, state, executor, on_ready))
    try:
        yield
    finally:
        state.ready, state.stopping = False, True
        warming.cancel()
        for batcher in state.batchers.values():
            await batcher.stop()
        await asyncio.to_thread(executor.shutdown, True)
        await asyncio.to_thread(state.workers.shutdown, True)


async def _warm_up(engine: Engine, config: ServeConfig, state: ServerState, executor, on_ready) -> None:
    started = time.perf_counter()
    try:
        await asyncio.get_running_loop().run_in_executor(executor, engine.warm_up, config.max_batch)
    except Exception as e:  # reported by /health; the process stays up to say so
        state.failed = f"the warm-up forward pass failed: {type(e).__name__}: {e}"
        log.error(state.failed)
        return
    state.ready = True
    if on_ready is not None:
        on_ready(time.perf_counter() - started)
