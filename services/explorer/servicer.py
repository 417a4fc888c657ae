"""ExplorerService over gRPC: a thin adapter from `rft.v1` messages to `ExplorerCore` and
`WeightReceiver`, mapping errors to status codes (bad input INVALID_ARGUMENT, a broken LoadWeights chunk
stream included, wrong state FAILED_PRECONDITION, a broken weight-sync group UNAVAILABLE)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from rft.v1 import common_pb2, explorer_pb2, explorer_pb2_grpc

from services.common.rpc.errors import ErrorMap, Rule
from services.explorer.core import ExplorerCore, find_checkpoints
from services.explorer.serve.endpoint_core import EndpointCore
from services.explorer.serve.sessions import SessionError
from services.explorer.tasksets import TasksetError
from services.explorer.weight_receiver import WeightReceiver
from services.weight_sync import GroupInfo, WeightSyncError
from services.weight_sync.errors import GroupBrokenError, MissingChunkError, StaleGenerationError

T = TypeVar("T")
SERVICE_NAME = explorer_pb2.DESCRIPTOR.services_by_name["ExplorerService"].full_name
STATUS = {
    "STARTING": common_pb2.MEMBER_STATUS_STARTING,
    "RUNNING": common_pb2.MEMBER_STATUS_RUNNING,
    "WAITING_SYNC": common_pb2.MEMBER_STATUS_WAITING_SYNC,
    "SYNCING": common_pb2.MEMBER_STATUS_SYNCING,
    "STOPPED": common_pb2.MEMBER_STATUS_STOPPED,
    "FAILED": common_pb2.MEMBER_STATUS_FAILED,
}


ERRORS = ErrorMap(  # services/common/rpc/errors.py
    # a broken chunk stream is the caller's
    Rule((KeyError, ValueError, MissingChunkError), grpc.StatusCode.INVALID_ARGUMENT),
    Rule((StaleGenerationError, TasksetError), grpc.StatusCode.FAILED_PRECONDITION),
    Rule((GroupBrokenError, WeightSyncError), grpc.StatusCode.UNAVAILABLE),
)
_guard = ERRORS.guard
_SESSION_CODES = {404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.FAILED_PRECONDITION}
SERVE_ERRORS = ErrorMap(  # the endpoint's session errors (HTTP-like status; the message names the field)
    Rule(
        SessionError,
        lambda exc: _SESSION_CODES.get(exc.status, grpc.StatusCode.INVALID_ARGUMENT),
        lambda exc: f"{exc.param}: {exc}",
    ),
)


class ExplorerServicer(explorer_pb2_grpc.ExplorerServiceServicer):
    def __init__(
        self,
        core: ExplorerCore,
        on_shutdown: Callable[[], Any] | None = None,
        serve: EndpointCore | None = None,
    ):
        self.core = core
        self.weights = WeightReceiver(core)
        self.on_shutdown = on_shutdown
        self.serve = serve  # the OpenAI-compatible endpoint's core (mode serve), for Feedback/Commit

    async def Explore(self, request: explorer_pb2.ExploreRequest, context: grpc.aio.ServicerContext):
        results = await _guard(context, lambda: self.core.explore(request.steps))
        metrics = results[-1].metrics if results else {}
        return explorer_pb2.ExploreResponse(
            step=self.core.step,
            experiences=sum(r.experiences for r in results),
            metrics=metrics,
            continue_exploring=not self.core._done(),
        )

    async def Eval(self, request: explorer_pb2.EvalRequest, context: grpc.aio.ServicerContext):
        metrics = await _guard(context, lambda: self.core.eval(list(request.tasksets)))
        return explorer_pb2.EvalResponse(step=self.core.step, metrics=metrics)

    async def Bench(self, request: explorer_pb2.BenchRequest, context: grpc.aio.ServicerContext):
        found = find_checkpoints(self.core.settings.job_dir, latest_only=request.latest_only)
        out = await _guard(context, lambda: self.core.bench(found, include_base=not request.skip_base))
        return explorer_pb2.BenchResponse(
            results=[explorer_pb2.EvalResponse(step=step, metrics=m) for step, m in sorted(out.items())]
        )

    async def SetupWeightSyncGroup(
        self, request: explorer_pb2.ExplorerSetupWeightSyncGroupRequest, context: grpc.aio.ServicerContext
    ):
        info = GroupInfo.from_proto(request.group)
        ranks = await _guard(context, lambda: self.weights.setup(info, request.rank_offset))
        return explorer_pb2.ExplorerSetupWeightSyncGroupResponse(ranks=ranks)

    async def TeardownWeightSyncGroup(
        self, request: explorer_pb2.ExplorerTeardownWeightSyncGroupRequest, context: grpc.aio.ServicerContext
    ):
        if not await self.weights.teardown(request.generation):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"generation {request.generation} is not the joined one ({self.weights.generation})",
            )
        return explorer_pb2.ExplorerTeardownWeightSyncGroupResponse()

    async def ReceiveWeights(
        self, request: explorer_pb2.ExplorerReceiveWeightsRequest, context: grpc.aio.ServicerContext
    ):
        if request.version <= 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "version: must be > 0")
        version = await _guard(context, lambda: self.weights.receive(request.version))
        return explorer_pb2.LoadWeightsResponse(version=common_pb2.ModelVersion(version=version))

    async def LoadWeights(self, request_iterator: AsyncIterator[common_pb2.WeightChunk], context):
        version, nbytes = await _guard(context, lambda: self.weights.load_chunks(request_iterator))
        return explorer_pb2.LoadWeightsResponse(version=version, bytes=nbytes)

    async def Status(self, request: explorer_pb2.ExplorerStatusRequest, context: grpc.aio.ServicerContext):
        info = self.core.status_info()
        return explorer_pb2.ExplorerStatus(
            explorer_id=info["explorer_id"],
            status=STATUS.get(info["status"], common_pb2.MEMBER_STATUS_UNSPECIFIED),
            step=info["step"],
            model_version=common_pb2.ModelVersion(version=info["model_version"]),
            rollout_workers=info["rollout_workers"],
            last_metrics=info["last_metrics"],
        )

    async def Shutdown(
        self, request: explorer_pb2.ExplorerShutdownRequest, context: grpc.aio.ServicerContext
    ):
        await self.core.stop()
        if self.on_shutdown is not None:
            self.on_shutdown()
        return explorer_pb2.ExplorerShutdownResponse()

    async def _serve_call(
        self, context: grpc.aio.ServicerContext, call: Callable[[EndpointCore], Awaitable[T]]
    ) -> T:
        if self.serve is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "this explorer serves no endpoint: set mode: serve (or explorer.rollout_model.enable_openai_api)",
            )
        serve = self.serve
        return await SERVE_ERRORS.guard(context, lambda: call(serve))

    async def Feedback(self, request: explorer_pb2.ServeFeedbackRequest, context: grpc.aio.ServicerContext):
        choice = request.choice_index if request.HasField("choice_index") else None

        async def call(serve: EndpointCore) -> str:
            return serve.feedback(request.reward, request.session_id, request.response_id, choice)

        return explorer_pb2.ServeFeedbackResponse(session_id=await self._serve_call(context, call))

    async def Commit(self, request: explorer_pb2.ServeCommitRequest, context: grpc.aio.ServicerContext):
        out = await self._serve_call(context, lambda serve: serve.commit(list(request.session_ids)))
        return explorer_pb2.ServeCommitResponse(
            committed=out["committed"], experiences=out["experiences"], model_versions=out["model_versions"]
        )


def registration(servicer: ExplorerServicer) -> tuple[Any, ExplorerServicer, str]:
    return (explorer_pb2_grpc.add_ExplorerServiceServicer_to_server, servicer, SERVICE_NAME)
