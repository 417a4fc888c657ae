"""The HTTP routes under /api/v1 that the `tinker` SDK calls, as a FastAPI app.

Sessions, models and sampling sessions live in this process. Work that touches a model
(create_model, forward_backward, optim_step, save/load weights, asample) is queued as a real
future (futures.py); its failure reaches the SDK as a `RequestFailedError` carrying our message.
A sampling client learns of its finished samples through one `retrieve_futures` long poll
(the client config turns that on) and fetches each result with `retrieve_future`.
The REST client's training-run and checkpoint routes answer at once (an unknown run or checkpoint
is a 404). Unknown routes answer 404 naming the route and what is supported; a wrong API key, 401.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from . import wire
from .expiry import TtlError
from .futures import UnknownFuture
from .server import NotFound, TinkerServer, UserError
from .sessions import SessionError

SUPPORTED = (
    "create_session session_heartbeat create_model get_info get_server_capabilities forward_backward "
    "optim_step save_weights save_weights_for_sampler load_weights create_sampling_session asample "
    "retrieve_future retrieve_futures cancel_future join_sampling_session sessions sessions/<id> "
    "sessions/<id>/finish healthz training_runs training_runs/<id> training_runs/<id>/checkpoints "
    "DELETE training_runs/<id>/checkpoints/<kind>/<name> PUT training_runs/<id>/checkpoints/<kind>/<name>/ttl "
    "checkpoints weights_info"
)
PROTO = "application/x-protobuf"


def _err(status: int, msg: str) -> JSONResponse:
    return JSONResponse({"detail": msg, "error": msg}, status_code=status)


API = "/api/v1"


def build_app(server: TinkerServer, poll_s: float = 20.0) -> FastAPI:
    """The app: the key check, then each group of routes, the catch-all for unsupported ones last."""
    app = FastAPI(title="rft serve tinker")
    _auth(app, server)
    _meta_routes(app, server)
    _session_routes(app, server)
    _training_routes(app, server)
    _sampling_routes(app, server)
    _future_routes(app, server, poll_s)
    _rest_routes(app, server)
    _unsupported_route(app)
    return app


def _queue(server: TinkerServer, fn, model_id: str | None = None, group: Any = None) -> dict[str, Any]:  # noqa: ANN001
    """Submit `fn` as a future; the SDK polls `retrieve_future` with the request id (and a sampling
    client `retrieve_futures` for its `group`)."""
    return {"request_id": server.futures.submit(fn, group), "model_id": model_id}


def _auth(app: FastAPI, server: TinkerServer) -> None:
    api = API

    @app.middleware("http")
    async def auth(request: Request, call_next):  # noqa: ANN001, ANN202
        key = request.headers.get("x-api-key")
        if server.api_key and request.url.path != f"{api}/healthz" and key != server.api_key:
            return _err(
                401, "invalid API key: set TINKER_API_KEY to the key `rft serve tinker` was started with"
            )
        return await call_next(request)


def _meta_routes(app: FastAPI, server: TinkerServer) -> None:
    """Health, the SDK's client configuration and telemetry, and what this server can train."""
    api = API

    @app.get(f"{api}/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(f"{api}/client/config")
    async def client_config() -> dict[str, Any]:
        return {
            "pjwt_auth_enabled": False,
            "use_pyqwest_transport": False,
            "proto_compress_fwdbwd": False,
            "sample_use_retrieve_futures": True,  # one retrieve_futures long poll per sampling client
            "sample_join_sampling_session": True,  # an unpickled SamplingClient asks for its clone id
        }

    @app.post(f"{api}/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": True}

    @app.post(f"{api}/telemetry")
    async def telemetry() -> dict[str, str]:
        return {"status": "accepted"}

    @app.get(f"{api}/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        names = list(server.base_models)
        return {"supported_models": [{"model_name": n, "trainable": True, "sampleable": True} for n in names]}


def _session_routes(app: FastAPI, server: TinkerServer) -> None:
    api = API

    @app.post(f"{api}/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        return {"type": "create_session", "session_id": server.sessions.create(await request.json())}

    @app.post(f"{api}/session_heartbeat")
    async def heartbeat(request: Request) -> Response:
        try:
            server.sessions.heartbeat((await request.json()).get("session_id"))
        except SessionError as exc:
            return _err(404, str(exc))
        return JSONResponse({"type": "session_heartbeat"})

    @app.post(f"{api}/sessions/{{sid}}/finish")
    async def finish(sid: str, request: Request) -> Response:
        reason = ((await request.json()).get("reason") or {}).get("type") or "success"
        try:
            server.sessions.finish(sid, str(reason))
        except SessionError as exc:
            return _err(404, str(exc))
        return Response(status_code=204)

    @app.get(f"{api}/sessions/{{sid}}")
    async def get_session(sid: str) -> Response:
        try:
            session = server.sessions.get(sid)
        except SessionError as exc:
            return _err(404, str(exc))
        runs = [m for m in server.models if m.startswith(f"{sid}:")]
        return JSONResponse(
            {
                "training_run_ids": runs,
                "sampler_ids": session.samplers,
                "user_metadata": session.user_metadata,
                "display_name": session.display_name,
            }
        )

    @app.get(f"{api}/sessions")
    async def list_sessions(limit: int = 20, offset: int = 0) -> dict[str, Any]:
        return {"sessions": server.sessions.ids(max(limit, 0), max(offset, 0))}


def _training_routes(app: FastAPI, server: TinkerServer) -> None:
    """Training clients: models, forward_backward, optim_step, saving and loading weights."""
    api = API

    def queue(fn, model_id: str | None = None) -> dict[str, Any]:  # noqa: ANN001
        return _queue(server, fn, model_id)

    @app.post(f"{api}/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        body = await request.json()
        return queue(lambda: server.create_model(body))

    @app.post(f"{api}/get_info")
    async def get_info(request: Request) -> Response:
        body = await request.json()
        model = server.models.get(body.get("model_id"))
        if model is None:
            return _err(404, f"unknown model_id {body.get('model_id')!r}")
        return JSONResponse(
            {
                "type": "get_info",
                "model_id": model.model_id,
                "model_name": model.base_model,
                "is_lora": bool(model.lora_rank),
                "lora_rank": model.lora_rank,
                "model_data": {
                    "arch": type(model.model).__name__,
                    "model_name": model.base_model,
                    "tokenizer_id": model.folder,
                },
            }
        )

    @app.post(f"{api}/forward_backward")
    async def forward_backward(request: Request) -> Response:
        try:
            req = wire.parse_forward_backward(await request.body())
        except wire.WireError as exc:
            return _err(422, str(exc))

        def work() -> bytes:
            outputs, metrics = server.model(req.model_id).forward_backward(req)
            return wire.forward_backward_output(outputs, metrics)

        return JSONResponse(queue(work, req.model_id))

    @app.post(f"{api}/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        body = await request.json()
        params = body.get("adam_params") or body.get("optim_params") or {}
        return queue(lambda: {"metrics": server.model(body["model_id"]).optim_step(params)}, body["model_id"])

    @app.post(f"{api}/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        body = await request.json()
        return queue(lambda: server.save(body, "weights"), body["model_id"])

    @app.post(f"{api}/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        body = await request.json()
        return queue(lambda: server.save(body, "sampler_weights"), body["model_id"])

    @app.post(f"{api}/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        body = await request.json()
        return queue(lambda: server.load(body), body.get("model_id"))


def _sampling_routes(app: FastAPI, server: TinkerServer) -> None:
    api = API

    def queue(fn, model_id: str | None = None, group: Any = None) -> dict[str, Any]:  # noqa: ANN001
        return _queue(server, fn, model_id, group)

    @app.post(f"{api}/create_sampling_session")
    async def create_sampling_session(request: Request) -> Response:
        body = await request.json()
        try:
            server.sessions.live(body.get("session_id"))
            sid = server.open_sampling(body.get("base_model"), body.get("model_path"))
        except (UserError, SessionError) as exc:
            return _err(400, str(exc))
        server.sessions.add_sampler(body["session_id"], sid)
        return JSONResponse({"type": "create_sampling_session", "sampling_session_id": sid})

    @app.get(f"{api}/samplers/{{sid}}")
    async def sampler(sid: str) -> Response:
        info = server.sampler_info.get(sid)
        return JSONResponse(info) if info else _err(404, f"unknown sampler {sid!r}")

    @app.post(f"{api}/join_sampling_session")
    async def join_sampling_session(request: Request) -> Response:
        sid = (await request.json()).get("sampling_session_id")
        if sid not in server.sampling:
            return _err(404, f"unknown sampling_session_id {sid!r}")
        return JSONResponse({"type": "join_sampling_session", "client_counter": server.sessions.join(sid)})

    @app.post(f"{api}/asample")
    async def asample(request: Request) -> dict[str, Any]:
        body = await request.json()
        # the sampling client's completion log (retrieve_futures): its session and its clone id
        group = (body.get("sampling_session_id"), int(body.get("seq_id") or 0) // 1_000_000_000)
        out = queue(lambda: server.sample(body), group=group)
        out["sample_sequence_ids"] = [
            f"{out['request_id']}-{i}" for i in range(int(body.get("num_samples", 1)))
        ]
        return out


def _future_routes(app: FastAPI, server: TinkerServer, poll_s: float) -> None:
    api = API

    @app.post(f"{api}/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        rid = (await request.json()).get("request_id")
        try:
            fut = await asyncio.to_thread(server.futures.wait, rid, poll_s)
        except UnknownFuture:
            return _err(
                404, f"unknown or expired future {rid!r}: results are kept {server.futures.keep_s:.0f} s"
            )
        if fut is None:
            return JSONResponse({"type": "try_again", "request_id": rid, "queue_state": "active"})
        if fut.cancelled():
            return JSONResponse({"error": f"request {rid} was cancelled (cancel_future)", "category": "user"})
        exc = fut.exception()
        if exc is not None:
            user = isinstance(exc, (UserError, ValueError, KeyError))
            return JSONResponse(
                {"error": f"{type(exc).__name__}: {exc}", "category": "user" if user else "server"}
            )
        result = fut.result()
        if isinstance(result, bytes):
            return Response(result, media_type=PROTO)
        return JSONResponse(result)

    @app.post(f"{api}/retrieve_futures")
    async def retrieve_futures(request: Request) -> Response:
        """A sampling client's completions after its cursor, long-polled (`timeout`, at most poll_s)."""
        body = await request.json()
        target = body.get("target") or {}
        sid = target.get("sampling_session_id")
        if sid not in server.sampling:
            return _err(404, f"unknown sampling_session_id {sid!r} (the server restarted?)")
        timeout = body.get("timeout")
        wait_s = poll_s if timeout is None else min(max(float(timeout), 0.0), poll_s)
        group = (sid, int(target.get("cloned_sampler_id") or 0))
        prev = int(body.get("prev_cursor") or 0)
        retrieved = [str(r) for r in body.get("retrieved_request_ids") or []]
        done, cursor = await asyncio.to_thread(server.futures.completions, group, prev, wait_s, retrieved)
        return JSONResponse({"completions": done, "cursor": cursor})

    @app.post(f"{api}/cancel_future")
    async def cancel_future(request: Request) -> Response:
        """Drop an abandoned request that has not started yet; one already running finishes."""
        rid = (await request.json()).get("request_id")
        try:
            server.futures.cancel(str(rid))
        except UnknownFuture:
            return _err(404, f"unknown or expired future {rid!r}")
        return Response(status_code=204)


def _rest_routes(app: FastAPI, server: TinkerServer) -> None:
    """The SDK's RestClient: training runs (one per training client), their checkpoints, weights info."""
    api = API

    async def answer(fn, *args) -> Response:  # noqa: ANN001
        try:
            return JSONResponse(await asyncio.to_thread(fn, *args))
        except NotFound as exc:
            return _err(404, str(exc))

    @app.get(f"{api}/training_runs")
    async def training_runs(limit: int = 20, offset: int = 0) -> Response:
        return await answer(server.training_runs, max(limit, 0), max(offset, 0))

    @app.get(f"{api}/training_runs/{{run_id}}")
    async def training_run(run_id: str) -> Response:
        return await answer(server.training_run, run_id)

    @app.get(f"{api}/training_runs/{{run_id}}/checkpoints")
    async def checkpoints(run_id: str) -> Response:
        return await answer(lambda: {"checkpoints": server.checkpoints(run_id)})

    @app.delete(f"{api}/training_runs/{{run_id}}/checkpoints/{{kind}}/{{name}}")
    async def delete_checkpoint(run_id: str, kind: str, name: str) -> Response:
        response = await answer(server.delete_checkpoint, run_id, f"{kind}/{name}")
        return Response(status_code=204) if response.status_code == 200 else response

    @app.put(f"{api}/training_runs/{{run_id}}/checkpoints/{{kind}}/{{name}}/ttl")
    async def set_ttl(run_id: str, kind: str, name: str, request: Request) -> Response:
        ttl = (await request.json()).get("ttl_seconds")
        try:
            response = await answer(server.set_ttl, run_id, f"{kind}/{name}", ttl)
        except TtlError as exc:
            return _err(400, str(exc))
        return Response(status_code=204) if response.status_code == 200 else response

    @app.get(f"{api}/checkpoints")
    async def user_checkpoints(limit: int = 100, offset: int = 0) -> Response:
        return await answer(server.user_checkpoints, max(limit, 0), max(offset, 0))

    @app.post(f"{api}/weights_info")
    async def weights_info(request: Request) -> Response:
        return await answer(server.weights_info, str((await request.json()).get("tinker_path")))


def _unsupported_route(app: FastAPI) -> None:
    api = API

    @app.api_route(f"{api}/{{rest:path}}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def unsupported(rest: str) -> Response:
        return _err(404, f"route /api/v1/{rest} is not supported by rft serve tinker; supported: {SUPPORTED}")
