"""The HTTP face of `biodistil serve` (FastAPI): routes, limits, the API key and errors without stack traces.

    POST /v1/predict     {"texts": [...]} or {"documents": [{"id", "text"}, ...]} -> {"records": [...]}, one record per
                         document as `biodistil predict` writes it; timing headers x-queue-time, x-inference-time, ...
                         ?format= (or "format") brat, pubtator, bioc, span_jsonl: the text `predict --format` writes
                         (formats.py); a body in that format (not JSON) is read as `predict --format` reads its input
    GET  /health         readiness: 200 once the model is loaded and warmed up, 503 before (also /health/ready)
    GET  /health/live    liveness: 200 while the process answers
    GET  /v1/model       the model's facts: task, labels, card, provenance, runtime, batching and limits
    GET  /metrics        Prometheus text format
    GET  /docs           OpenAPI docs (/openapi.json)

Every error is JSON `{"error": message, "type": kind}`; an unexpected one says only that it happened (the traceback
goes to the server's log). With an API key, every route but the health probes asks for it (`Authorization: Bearer
KEY` or `X-API-Key: KEY`).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from biodistil.documents.model import SpanDocument
from biodistil.documents.writers import brat_files
from biodistil.errors import BiodistilError
from biodistil.export.predict import Document
from biodistil.export.span_predict import read_span_body, unique_ids
from biodistil.serving.batching import Batcher, Overloaded
from biodistil.serving.formats import BRAT_ANN_MEDIA_TYPE, FORMATS, MEDIA_TYPES, render, span_documents
from biodistil.serving.metrics import ServerMetrics
from biodistil.serving.settings import Limits, ServeSettings
from biodistil.version import __version__

LOG = logging.getLogger("biodistil.serve")
ROUTES = ("/v1/predict", "/v1/model", "/health", "/health/ready", "/health/live", "/metrics", "/docs",
          "/openapi.json")
OPEN_ROUTES = ("/health", "/health/ready", "/health/live")  # probes of load balancers: no key, nothing to read
TOKENIZE_IN_THREAD_CHARS = 10_000  # requests larger than this count their sub-words off the event loop


class DocumentIn(BaseModel):
    """One document: its id (default: its index in the request), its text and, for a pair classifier, the second."""

    model_config = ConfigDict(extra="forbid")
    id: str | None = None
    text: str
    text_pair: str | None = None


class PredictRequest(BaseModel):
    """Texts, or documents with ids; `format`: how the answer comes (jsonl: `predict`'s JSON records; brat, pubtator,
    bioc, span_jsonl: the text `predict --format` writes)."""

    model_config = ConfigDict(extra="forbid")
    texts: list[str] | None = Field(None, description="texts; their records get ids 0, 1, ...")
    documents: list[DocumentIn] | None = Field(None, description="documents with ids (and pair texts)")
    format: str | None = Field(None, description="the answer's format (default jsonl; or the query's ?format=): "
                               + ", ".join(FORMATS))


@dataclass(frozen=True)
class Parsed:
    """A request's documents (`Document`s for records, `SpanDocument`s for a document format), the answer's format,
    and whether the body was one brat `.txt` (answered with its `.ann` text)."""

    documents: list[Document] | list[SpanDocument]
    format: str = "jsonl"
    brat_body: bool = False


class PredictResponse(BaseModel):
    """One record per document, in order: `{"id", "entities": [{start, end, text, label, score}]}` for a token
    classifier, `{"id", "label" (or "labels"), "probabilities"}` for a classifier."""

    records: list[dict[str, Any]]


class BratFile(BaseModel):
    """One document of a brat answer: its id, its brat file NAME and the text of NAME.ann (NAME.txt: the text sent)."""

    id: str
    name: str
    ann: str


class BratResponse(BaseModel):
    """?format=brat on JSON documents: each document's .ann, as `predict --format brat` writes the folder."""

    documents: list[BratFile]


class Refused(Exception):
    """A request answered with an error: its status, kind and message (and headers, e.g. Retry-After)."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}


@dataclass
class _State:
    service: Any = None  # the Service, once loaded and warmed up
    failure: str | None = None


def create_app(settings: ServeSettings, load: Callable[[], Any], on_failure: Callable[[], None] | None = None
               ) -> FastAPI:
    """The app serving what `load()` returns (a `service.Service`: called on documents, `.tokens(documents)`,
    `.facts()`); it is loaded in the model's thread after the server starts listening, and readiness waits for it.
    `on_failure()` is told when loading fails (the command then stops the server)."""
    metrics, state = ServerMetrics(), _State()
    batcher = Batcher(lambda documents: state.service(documents), settings.batching, metrics.on_batch)

    async def load_service() -> None:
        try:
            state.service = await batcher.call(load)
            metrics.ready.set(1)
            LOG.info("Ready: %s (one document alone: %.1f ms)", state.service.predictor.description,
                     state.service.batch1_ms)
        except Exception as error:  # reported, and the server stops
            state.failure = str(error) if isinstance(error, BiodistilError) else f"{type(error).__name__}: {error}"
            LOG.error("Could not load the model: %s", state.failure, exc_info=not isinstance(error, BiodistilError))
            if on_failure is not None:
                on_failure()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        loading = asyncio.get_running_loop().create_task(load_service())
        yield
        await asyncio.gather(loading, return_exceptions=True)
        await batcher.stop()

    app = FastAPI(title="biodistil serve", version=__version__, lifespan=lifespan,
                  description="A biodistil student: entities with character offsets, or labels and probabilities, "
                  "for each document — what `biodistil predict` writes.")
    app.state.batcher, app.state.metrics, app.state.serving = batcher, metrics, state
    app.add_middleware(Guard, metrics=metrics, api_key=settings.api_key)
    _routes(app, settings.limits, state, batcher, metrics)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _routes(app: FastAPI, limits: Limits, state: _State, batcher: Batcher, metrics: ServerMetrics) -> None:
    def readiness() -> JSONResponse:
        if state.service is not None:
            return JSONResponse({"status": "ready"})
        status = {"status": "failed", "error": state.failure} if state.failure else {"status": "loading"}
        return JSONResponse(status, status_code=503, headers={"Retry-After": "1"})

    app.get("/health", summary="Readiness: 200 once the model is loaded and warmed up")(readiness)
    app.get("/health/ready", summary="Readiness (as /health)")(readiness)

    @app.get("/health/live", summary="Liveness: 200 while the process answers")
    def liveness() -> JSONResponse:
        return JSONResponse({"status": "live"})

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    def prometheus() -> Response:
        metrics.queue_depth.set(batcher.depth)
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/model", summary="The served model's facts: task, labels, card, provenance, runtime")
    def model() -> JSONResponse:
        if state.service is None:
            return _error(metrics, Refused(503, "loading", "the model is still loading", {"Retry-After": "1"}))
        return JSONResponse(state.service.facts())

    @app.post("/v1/predict", summary="Records for texts or documents", response_model=PredictResponse,
              responses={400: {}, 401: {}, 413: {}, 422: {}, 429: {}, 503: {}, 504: {}})
    async def predict_route(request: Request) -> Response:
        try:
            return await _predict(request, limits, state, batcher, metrics)
        except Refused as refused:
            return _error(metrics, refused)
        except Exception:  # no stack trace reaches a client: it goes to the log
            LOG.exception("Prediction failed")
            return _error(metrics, Refused(500, "internal", "the prediction failed on the server; its log says why"))


async def _predict(request: Request, limits: Limits, state: _State, batcher: Batcher,
                   metrics: ServerMetrics) -> Response:
    arrived = time.perf_counter()
    if state.service is None:
        raise Refused(503, "loading", "the model is still loading; retry shortly (GET /health says when it is "
                      "ready)", {"Retry-After": "1"})
    parsed = parse_request(await read_body(request, limits.max_body_bytes), limits,
                           request.headers.get("content-type"), request.query_params.get("format"))
    if parsed.format not in state.service.formats():
        raise Refused(422, "validation", f"format {parsed.format!r} needs a token classifier (annotated documents); "
                      f"this model answers in: {', '.join(state.service.formats())}")
    documents = parsed.documents
    if not documents:
        return _respond(parsed, [], {})
    counted = time.perf_counter()
    if sum(map(characters, documents)) > TOKENIZE_IN_THREAD_CHARS:
        tokens = await asyncio.to_thread(state.service.tokens, documents)
    else:
        tokens = state.service.tokens(documents)
    tokenized = time.perf_counter()
    try:
        answer = await asyncio.wait_for(batcher.submit(documents, tokens), limits.request_timeout)
    except Overloaded as full:
        raise Refused(429, "overloaded", f"the server is busy: {full}", {"Retry-After": str(full.retry_after)}) \
            from None
    except TimeoutError:
        raise Refused(504, "timeout", f"not answered within {limits.request_timeout:g} s (--request-timeout): the "
                      "server is overloaded; retry later", {"Retry-After": str(batcher.retry_after())}) from None
    total = time.perf_counter() - arrived
    metrics.latency.observe(total)
    metrics.queued.observe(answer.queue_seconds)
    headers = {"x-total-time": _ms(total), "x-tokenization-time": _ms(tokenized - counted),
               "x-queue-time": _ms(answer.queue_seconds), "x-inference-time": _ms(answer.inference_seconds),
               "x-batch-size": str(answer.batch_documents), "x-compute-tokens": str(tokens)}
    return _respond(parsed, answer.records, headers)


def _respond(parsed: Parsed, results: list[Any], headers: dict[str, str]) -> Response:
    """`{"records": [...]}`, or the text of the document format (`formats.render`)."""
    if parsed.format == "jsonl":
        return JSONResponse({"records": results}, headers=headers)
    rendered = render(parsed.format, results, parsed.brat_body)
    return Response(rendered.body, media_type=rendered.media_type, headers=headers)


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.2f}"


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it is longer than `limit` bytes (declared or sent)."""
    declared = request.headers.get("content-length", "")
    too_long = Refused(413, "limit", f"the request body is over {limit:,} bytes (--max-body-bytes); send fewer or "
                       "shorter documents per request")
    if declared.isdigit() and int(declared) > limit:
        raise too_long
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_long
        chunks.append(chunk)
    return b"".join(chunks)


def parse_request(body: bytes, limits: Limits, content_type: str | None = None, asked: str | None = None
                  ) -> Parsed:
    """The documents of a request body and the answer's format (`asked`: the query's `?format=`). The body is a JSON
    request of texts or documents when its Content-Type is JSON or no document format is asked; otherwise it is a
    text in the asked document format. 400 for bytes that are not UTF-8, text that is not JSON or a body not in its
    format (the reader's message: line and field); 422 for JSON that is not a request or an unknown format; 413 over
    the limits (documents per request, characters per document)."""
    if asked is not None:
        _check_format(asked)
    body_format = None if asked in (None, "jsonl") or _is_json(content_type) else asked
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Refused(400, "bad_request", f"the request body is not UTF-8 text (byte {err.start}); send "
                      f"{body_format or 'JSON'} in UTF-8") from None
    parsed = _json_request(text, asked) if body_format is None else _format_body(text, body_format)
    check_limits(parsed.documents, limits)
    return parsed


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _check_format(name: str) -> None:
    if name not in FORMATS:
        raise Refused(422, "validation", f"format {name!r} is not served; formats: {', '.join(FORMATS)}")


def _json_request(text: str, asked: str | None) -> Parsed:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as err:
        raise Refused(400, "bad_request", f"the request body is not JSON ({err.msg}, line {err.lineno} column "
                      f"{err.colno}); send {{\"texts\": [...]}} or {{\"documents\": [{{\"id\", \"text\"}}]}} (or a "
                      "body in a document format with ?format= and its own Content-Type)") from None
    try:
        request = PredictRequest.model_validate(payload)
    except ValidationError as err:
        raise Refused(422, "validation", "not a prediction request: " + "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in err.errors()[:5])) from None
    if (request.texts is None) == (request.documents is None):
        raise Refused(422, "validation", "give either \"texts\" (a list of strings) or \"documents\" (a list of "
                      "{\"id\", \"text\"}), not both or neither")
    if request.format is not None and asked is not None and request.format != asked:
        raise Refused(422, "validation", f"two formats asked: ?format={asked} and \"format\": {request.format!r}; "
                      "give one")
    format_name = request.format or asked or "jsonl"
    _check_format(format_name)
    documents = [Document(str(i), text) for i, text in enumerate(request.texts)] if request.texts is not None else \
        [Document(d.id if d.id is not None else str(i), d.text, d.text_pair) for i, d in enumerate(request.documents)]
    if format_name == "jsonl":
        return Parsed(documents, format_name)
    return Parsed(_annotated(documents, format_name), format_name)


def _annotated(documents: list[Document], format_name: str) -> list[SpanDocument]:
    """JSON documents to be answered in a document format: single texts with ids that name one document each."""
    paired = next((i for i, d in enumerate(documents) if d.text_pair is not None), None)
    if paired is not None:
        raise Refused(422, "validation", f"documents.{paired}.text_pair: format {format_name} annotates single texts; "
                      "a pair classifier answers in jsonl")
    try:
        annotated = unique_ids(span_documents(documents))
        if format_name == "brat":
            brat_files(annotated, "the request")  # two ids that make one file name: refused before the model runs
    except BiodistilError as err:
        raise Refused(422, "validation", str(err)) from None
    return annotated


def _format_body(text: str, format_name: str) -> Parsed:
    """A body in a document format, read as `predict --format` reads its input (a brat body: one `.txt`)."""
    try:
        documents = read_span_body(text, format_name)
    except BiodistilError as err:
        raise Refused(400, "bad_request", f"the request body is not {format_name} (?format={format_name}): {err}") \
            from None
    return Parsed(documents, format_name, brat_body=format_name == "brat")


def check_limits(documents: list[Document] | list[SpanDocument], limits: Limits) -> None:
    """413 for more documents than `--max-documents`, or a document longer than `--max-chars` characters."""
    if len(documents) > limits.max_documents:
        raise Refused(413, "limit", f"the request holds {len(documents):,} documents; at most {limits.max_documents:,} "
                      "a request (--max-documents): split it")
    for index, document in enumerate(documents):
        length = characters(document)
        if length > limits.max_chars:
            raise Refused(413, "limit", f"document {index} (id {document.id!r}) holds {length:,} characters; at most "
                          f"{limits.max_chars:,} a document (--max-chars): split it")


def characters(document: Document | SpanDocument) -> int:
    """A document's characters (with a pair classifier's second text): what --max-chars counts."""
    return len(document.text) + len(getattr(document, "text_pair", None) or "")


def _error(metrics: ServerMetrics, refused: Refused) -> JSONResponse:
    metrics.errors.labels(refused.kind).inc()
    return JSONResponse({"error": refused.message, "type": refused.kind}, status_code=refused.status,
                        headers=refused.headers)


class Guard:
    """ASGI middleware around every route: the API key (401 without it), the request count by route and status, and a
    JSON 500 without a stack trace for anything a route let escape."""

    def __init__(self, app: Any, metrics: ServerMetrics, api_key: str | None):
        self.app, self.metrics, self.api_key = app, metrics, api_key

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"
        status: dict[str, int | None] = {"code": None}

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        if route == "/v1/predict":
            self.metrics.accepted.inc()
        self.metrics.in_flight.inc()
        try:
            if self.api_key is not None and scope["path"] not in OPEN_ROUTES and not self._authorised(scope):
                refused = Refused(401, "unauthorized", "this server needs an API key: send `Authorization: Bearer "
                                  "KEY` or `X-API-Key: KEY`", {"WWW-Authenticate": "Bearer"})
                await _error(self.metrics, refused)(scope, receive, sending)
                return
            await self.app(scope, receive, sending)
        except Exception:
            LOG.exception("Unexpected error on %s", scope["path"])
            if status["code"] is None:  # nothing sent yet
                await _error(self.metrics, Refused(500, "internal", "an error on the server; its log says "
                             "why"))(scope, receive, sending)
        finally:
            self.metrics.requests.labels(route, str(status["code"] or 500)).inc()
            self.metrics.in_flight.dec()

    def _authorised(self, scope: dict) -> bool:
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        given = headers.get("x-api-key") or ""
        bearer = headers.get("authorization", "")
        if bearer.lower().startswith("bearer "):
            given = bearer[7:].strip()
        return hmac.compare_digest(given.encode(), (self.api_key or "").encode())


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, with the request body /v1/predict reads itself (its size is checked before it is parsed)."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    body = PredictRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(body.pop("$defs", {}))
    components["PredictRequest"] = body
    brat = BratResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(brat.pop("$defs", {}))
    components["BratResponse"] = brat
    route = schema["paths"]["/v1/predict"]["post"]
    def text(description: str) -> dict[str, Any]:
        return {"schema": {"type": "string", "description": description}}

    route["requestBody"] = {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/PredictRequest"}},
        "text/plain": text("with ?format=pubtator, span_jsonl or brat: a PubTator file, span JSON lines or one brat "
                           ".txt, read as `predict --format` reads its input"),
        "application/xml": text("with ?format=bioc: a BioC XML collection")}}
    route["parameters"] = [{"name": "format", "in": "query", "required": False, "schema": {
        "type": "string", "enum": list(FORMATS), "default": "jsonl"}, "description": "the answer's format: jsonl "
        "(`{\"records\": [...]}`) or the text `predict --format` writes; a body that is not JSON is read in it"}]
    answers = {media: text(f"?format={name}") for name, media in MEDIA_TYPES.items() if name not in ("jsonl", "brat")}
    answers[BRAT_ANN_MEDIA_TYPE] = text("?format=pubtator; or a brat body's .ann")
    route["responses"]["200"]["content"] |= answers
    route["responses"]["200"]["content"]["application/json"]["schema"] = {"oneOf": [
        {"$ref": "#/components/schemas/PredictResponse"}, {"$ref": "#/components/schemas/BratResponse"}]}
    route["responses"]["200"]["description"] = (
        "jsonl: {\"records\": [...]}; brat: {\"documents\": [{\"id\", \"name\", \"ann\"}]} (a brat .txt body: its .ann "
        "text); pubtator (text/plain), bioc (application/xml), span_jsonl (application/x-ndjson): the file `biodistil "
        "predict --format` writes for the same documents")
    app.openapi_schema = schema
    return schema
