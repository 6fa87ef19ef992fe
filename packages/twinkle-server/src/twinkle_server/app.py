"""The HTTP routes of the Tinker API (paths and bodies as the ``tinker`` 0.38 client sends them).

JSON bodies are validated with the client's own pydantic request types; forward/forward_backward
arrive as protobuf. Every route but ``/api/v1/healthz`` and the signed download URLs needs an API
key. Bodies over ``server.max_request_mb`` are refused with 413 while they stream in (a lying
``Content-Length`` too); a client that disconnects mid-request costs nothing but its own request.
Bodies are decoded and checked on worker threads, never on the event loop (JSON nesting depth is
checked before parsing), so ``/healthz`` and the long polls answer while big requests arrive. Every
route the client has is answered: what this server does not do gets a 400 saying so.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.responses import FileResponse
from tinker import types

from twinkle_server.auth import KeyStore, key_from_headers
from twinkle_server.checks import MAX_JSON_DEPTH, encodable, json_depth, refuse_bool_numbers
from twinkle_server.downloads import tar_stream
from twinkle_server.errors import ApiError
from twinkle_server.service import Service
from twinkle_server.wire import PROTO

logger = logging.getLogger("twinkle_server")


#: Statuses the client retries with the same seq_id (a too-busy key's 429): the scheduler keeps waiting for those
RETRIED = (408, 409, 429)
#: A download token is a few hundred characters (claims and an HMAC); anything much longer was not made here.
MAX_TOKEN_CHARS = 4096


class BodyLimit:
    """ASGI middleware: 413 for a body over ``limit`` bytes (declared or streamed), 415 for compressed bodies."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").lower()
        if encoding not in ("identity", ""):
            await _send_error(send, 415, f"Content-Encoding {encoding!r} is not supported; send the body "
                                         "uncompressed (the server's client config says proto_compress_fwdbwd=false).")
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await _send_error(send, 413, self._message(int(declared)))
            return
        received = 0

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:  # a body longer than declared, or chunked: stop reading it
                    raise ApiError(413, self._message(received))
            return message

        await self.app(scope, limited_receive, send)

    def _message(self, size: int) -> str:
        return (f"the request body has {size} bytes or more, over this server's limit of {self.limit} "
                "(server.max_request_mb); send fewer datums per request.")


async def _send_error(send: Any, status: int, message: str) -> None:
    body = json.dumps({"detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def create_app(service: Service, keys: KeyStore) -> Any:
    """The FastAPI application over ``service``, wrapped in the body-size limit."""
    app = FastAPI(title="twinkle-server (Tinker API)", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(ClientDisconnect)
    async def disconnected(_: Request, __: ClientDisconnect) -> Response:
        return Response(status_code=400)  # nobody is listening; the request simply ends

    async def owner(request: Request) -> str:
        key = key_from_headers(request.headers.get("x-api-key"), request.headers.get("authorization"))
        found = keys.owner(key)
        if found is None:
            raise ApiError(401, "missing or unknown API key: pass api_key=... to the client or set TINKER_API_KEY "
                                "to a key made by `twinkle serve keygen`.")
        return found

    def parse(raw: bytes, model: Any = None) -> Any:
        """A JSON body (on a worker thread): depth checked before parsing, then the client's own type."""
        if json_depth(raw) > MAX_JSON_DEPTH:
            raise ApiError(400, f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels; the Tinker API's bodies "
                                "are flat.")
        try:
            data = json.loads(raw or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise ApiError(400, f"the body is not valid JSON ({exc}).") from None
        if model is None:
            return data
        if isinstance(data, dict):
            refuse_bool_numbers(model, data)
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:5])
            raise ApiError(400, f"invalid {model.__name__}: {problems}.") from None

    async def body(request: Request, model: Any = None) -> Any:
        return await run_in_threadpool(parse, await request.body(), model)

    Owner = Depends(owner)

    # ------------------------------------------------- routes that only call the service
    def json_route(path: str, request_type: Any, handler: Any, field: str | None = None) -> None:
        """POST ``path``: the body validated as ``request_type``, then ``handler(owner, body or body.field)``."""
        async def route(request: Request, who: str = Owner) -> JSONResponse:
            raw = await request.body()

            def work() -> Any:
                parsed = parse(raw, request_type)
                try:
                    return encodable(handler(who, parsed if field is None else getattr(parsed, field)))
                except ApiError as exc:  # refused before it was queued: unless retried, its seq_id never comes
                    if exc.status not in RETRIED:
                        service.refused(who, getattr(parsed, "model_id", None), getattr(parsed, "seq_id", None))
                    raise

            return JSONResponse(await run_in_threadpool(work))

        app.post(path, name=handler.__name__)(route)

    # JSON routes whose whole work is the service call: path -> (request type, handler[, the one field it takes])
    for path, spec in {
        "/api/v1/create_session": (types.CreateSessionRequest, service.create_session),
        "/api/v1/session_heartbeat": (types.SessionHeartbeatRequest, service.heartbeat, "session_id"),
        "/api/v1/create_model": (types.CreateModelRequest, service.create_model),
        "/api/v1/get_info": (types.GetInfoRequest, service.get_info, "model_id"),
        "/api/v1/unload_model": (types.UnloadModelRequest, service.unload_model, "model_id"),
        "/api/v1/optim_step": (types.OptimStepRequest, service.optim_step),
        "/api/v1/save_weights": (types.SaveWeightsRequest, service.save_weights),
        "/api/v1/save_weights_for_sampler": (types.SaveWeightsForSamplerRequest, service.save_weights_for_sampler),
        "/api/v1/save_weights_external": (types.SaveWeightsExternalRequest, service.save_weights_external),
        "/api/v1/load_weights": (types.LoadWeightsRequest, service.load_weights),
        "/api/v1/create_sampling_session": (types.CreateSamplingSessionRequest, service.create_sampling_session),
        "/api/v1/join_sampling_session": (types.JoinSamplingSessionRequest, service.join_sampling_session,
                                          "sampling_session_id"),
        "/api/v1/asample": (types.SampleRequest, service.asample),
    }.items():
        json_route(path, *spec)

    def path_route(method: str, path: str, handler: Any) -> None:
        """``method path``: ``handler(owner, *path parameters in path order)``; a handler's None answers ``{}``."""
        names = re.findall(r"{(\w+)", path)

        async def route(request: Request, who: str = Owner) -> Any:
            result = await run_in_threadpool(handler, who, *(request.path_params[name] for name in names))
            return {} if result is None else result

        app.add_api_route(path, route, methods=[method], name=handler.__name__)

    # routes whose path parameters are the whole request
    for method, path, handler in (
        ("POST", "/api/v1/sessions/{session_id}/finish", service.finish_session),
        ("GET", "/api/v1/sessions/{session_id}", service.session_info),
        ("GET", "/api/v1/training_runs/{model_id}/checkpoints", service.list_checkpoints),
        ("POST", "/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/publish",
         service.publish_checkpoint),
        ("DELETE", "/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/publish",
         service.publish_checkpoint),
        ("DELETE", "/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}", service.delete_checkpoint),
        ("GET", "/api/v1/training_runs/{model_id}", service.training_run),
        ("GET", "/api/v1/samplers/{sampler_id}", service.sampler_info),
    ):
        path_route(method, path, handler)

    # ------------------------------------------------------------------ service
    @app.get("/api/v1/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config(_: str = Owner) -> dict:
        return service.client_config()

    @app.post("/api/v1/client/dynamic_config")
    async def client_dynamic_config(_: str = Owner) -> dict:
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": True}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities(_: str = Owner) -> dict:
        return service.capabilities()

    @app.post("/api/v1/telemetry")
    async def telemetry(_: str = Owner) -> dict:
        return {"status": "accepted"}

    @app.post("/api/v1/cancel_future")
    async def cancel_future(request: Request, who: str = Owner) -> dict:
        parsed = await body(request)
        request_id = parsed.get("request_id") if isinstance(parsed, dict) else None
        if not isinstance(request_id, str):
            raise ApiError(400, 'cancel_future takes {"request_id": "..."}.')
        await run_in_threadpool(service.cancel, who, request_id)
        return {}

    # --------------------------------------------------------------- downloads
    @app.get("/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/external_weights_urls")
    async def external_weights_urls(request: Request, model_id: str, checkpoint_id: str, who: str = Owner) -> dict:
        return await run_in_threadpool(service.external_weights_urls, who, model_id, checkpoint_id,
                                       str(request.base_url).rstrip("/"))

    @app.get("/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/archive")
    async def archive(request: Request, model_id: str, checkpoint_id: str, who: str = Owner) -> Response:
        found = await run_in_threadpool(service.archive_url, who, model_id, checkpoint_id,
                                        str(request.base_url).rstrip("/"))
        return JSONResponse(found, status_code=302, headers={"Location": found["url"]})

    @app.get("/api/v1/downloads/{token}")
    async def download(token: str) -> Response:
        if len(token) > MAX_TOKEN_CHARS:  # ours are a few hundred characters: never worth decoding
            raise ApiError(414, f"this download link is {len(token)} characters long, not one this server made; ask "
                                "for a new one (get_external_weights_urls).")
        directory, file, name = await run_in_threadpool(service.download, token)
        if file is not None:
            return FileResponse(directory / file, filename=file.rsplit("/", 1)[-1])
        return StreamingResponse(tar_stream(directory, name), media_type="application/x-tar",
                                 headers={"Content-Disposition": f'attachment; filename="{name}.tar"'})

    @app.put("/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id:path}/ttl")
    async def checkpoint_ttl(request: Request, model_id: str, checkpoint_id: str, who: str = Owner) -> dict:
        parsed = await body(request)
        if not isinstance(parsed, dict) or "ttl_seconds" not in parsed:
            raise ApiError(400, 'set_checkpoint_ttl takes {"ttl_seconds": <seconds or null>}.')
        await run_in_threadpool(service.set_checkpoint_ttl, who, model_id, checkpoint_id, parsed["ttl_seconds"])
        return {}

    @app.get("/metrics")
    async def metrics(who: str = Owner) -> PlainTextResponse:
        return PlainTextResponse(service.metrics.prometheus(owner=who))

    # ------------------------------------------------- training and checkpoints
    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request, who: str = Owner) -> dict:
        if PROTO not in request.headers.get("content-type", ""):
            raise ApiError(415, f"forward_backward takes a protobuf ForwardBackwardRequest (Content-Type: {PROTO}).")
        return await run_in_threadpool(service.forward_backward, who, await request.body())

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request, who: str = Owner) -> Response:
        parsed = await body(request, types.FutureRetrieveRequest)
        status, result, is_proto = await service.retrieve(who, parsed.request_id,
                                                          PROTO in request.headers.get("accept", ""))
        if is_proto:
            return Response(result, status_code=status, media_type=PROTO)
        return JSONResponse(result, status_code=status)

    @app.post("/api/v1/weights_info")
    async def weights_info(request: Request, who: str = Owner) -> dict:
        parsed = await body(request)
        if not isinstance(parsed, dict) or not isinstance(parsed.get("tinker_path"), str):
            raise ApiError(400, 'weights_info takes {"tinker_path": "tinker://..."}.')
        return await run_in_threadpool(service.weights_info, who, parsed["tinker_path"])

    # ---------------------------------------------------------- paginated lists
    @app.get("/api/v1/sessions")
    async def list_sessions(who: str = Owner, limit: int = 20, offset: int = 0) -> dict:
        return {"sessions": service.store.sessions(who)[offset:offset + limit]}

    @app.get("/api/v1/training_runs")
    async def training_runs(who: str = Owner, limit: int = 20, offset: int = 0) -> dict:
        return service.training_runs(who, limit, offset)

    @app.get("/api/v1/checkpoints")
    async def user_checkpoints(who: str = Owner, limit: int = 100, offset: int = 0) -> dict:
        return service.list_user_checkpoints(who, limit, offset)

    # ------------------------------------------- routes of the client this server does not serve
    for method, path, what in UNSUPPORTED:
        app.add_api_route(path, _unsupported(what), methods=[method], name=f"unsupported {path}")

    @app.api_route("/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def unknown(request: Request, rest: str) -> Response:
        raise ApiError(404, f"{request.method} /api/v1/{rest} is not a route of the Tinker API served here (tinker "
                            "0.38); check the client version and the URL.")

    return BodyLimit(app, service.config.server.max_request_bytes)


#: (method, path, what it is) of the client's routes this server answers with "not supported".
UNSUPPORTED = (
    ("POST", "/api/v1/create_custom_loss", "server-side custom losses (forward_backward_custom works: it runs the "
                                           "loss in the client)"),
    ("POST", "/api/v1/auth/token", "the JWT exchange (this server takes the API key itself)"),
    ("POST", "/api/v1/copy_weights", "copying weights between projects"),
    ("POST", "/api/v1/retrieve_futures", "batched future retrieval (the client config says to use retrieve_future)"),
    ("PUT", "/api/v1/sessions/{session_id}/project", "projects"),
    ("POST", "/api/v1/sessions/{session_id}/trace_export", "session trace export"),
    ("GET", "/api/v1/sessions/{session_id}/trace_export", "session trace export"),
    ("POST", "/api/v1/sessions/search", "session search (list_sessions works)"),
    ("GET", "/api/v1/audit", "audit logs"),
    ("GET", "/api/v1/billing/usage/events", "billing"),
    ("GET", "/api/v1/billing/usage/checkpoints/current", "billing"),
)


def _unsupported(what: str) -> Any:
    async def route(_: Request) -> Response:
        raise ApiError(400, f"{what}: not supported by this server (twinkle serve); see docs/server.md for what is.")

    return route
