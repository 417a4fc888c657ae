"""`TrainerServicer`: the `rft.v1.TrainerService` RPCs as a thin proto <-> `TrainerCore` adapter.

Errors: a call in the wrong state -> FAILED_PRECONDITION, a bad argument -> INVALID_ARGUMENT with
the field named, no full batch within `timeout_ms` -> DEADLINE_EXCEEDED.  The weight-sync RPCs go
to a `WeightSync` object (`weight_sync.py`) that shares the core's lock and state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
from rft.v1 import common_pb2, trainer_pb2, trainer_pb2_grpc

from services.common.rpc.errors import ErrorMap, Rule
from services.common.rpc.server import Registration
from services.trainer.core import InvalidRequest, NoBatchError, PreconditionError, TrainerCore, TrainerState
from services.trainer.weight_sync import WeightSync

__all__ = ["TrainerServicer", "registration"]

_STATUS = {
    TrainerState.STARTING: common_pb2.MEMBER_STATUS_STARTING,
    TrainerState.READY: common_pb2.MEMBER_STATUS_RUNNING,
    TrainerState.TRAINING: common_pb2.MEMBER_STATUS_RUNNING,
    TrainerState.STOPPED: common_pb2.MEMBER_STATUS_STOPPED,
    TrainerState.FAILED: common_pb2.MEMBER_STATUS_FAILED,
}


ERRORS = ErrorMap(  # services/common/rpc/errors.py
    Rule(InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),  # its message names the field
    Rule(PreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    Rule(NoBatchError, grpc.StatusCode.DEADLINE_EXCEEDED),
)
_call = ERRORS.guard


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(
        self, core: TrainerCore, weight_sync: WeightSync, on_shutdown: Callable[[], None] | None = None
    ):
        self.core = core
        self.weight_sync = weight_sync
        self.on_shutdown = on_shutdown

    async def GetWeightSyncInfo(self, request, context):
        info = await _call(context, lambda: self.weight_sync.get_info(request.receivers))
        return info.to_proto()

    async def SetupWeightSyncGroup(self, request, context):
        rank = await _call(context, lambda: self.weight_sync.setup(request.group))
        return trainer_pb2.SetupWeightSyncGroupResponse(rank=rank)

    async def TeardownWeightSyncGroup(self, request, context):
        await _call(context, lambda: self.weight_sync.teardown(request.generation))
        return trainer_pb2.TeardownWeightSyncGroupResponse()

    async def SyncWeights(self, request, context):
        result = await _call(
            context, lambda: self.weight_sync.sync(self.weight_sync.requested(request.method))
        )
        return trainer_pb2.SyncWeightsResponse(
            version=common_pb2.ModelVersion(
                version=result.version, step=result.step, checkpoint_path=result.checkpoint_path
            ),
            seconds=result.seconds,
            bytes=result.nbytes,
        )

    async def TrainStep(self, request, context):
        result = await _call(context, lambda: self.core.train_step(request.timeout_ms or 60_000))
        return trainer_pb2.TrainStepResponse(
            step=result.step, metrics=result.metrics, continue_training=result.continue_training
        )

    async def SaveCheckpoint(self, request, context):
        step, path, hf_path = await _call(
            context, lambda: self.core.save_checkpoint(request.block_until_saved, request.save_as_hf)
        )
        return trainer_pb2.SaveCheckpointResponse(step=step, path=path, hf_path=hf_path)

    async def Status(self, request, context):
        s = self.core.status()
        return trainer_pb2.TrainerStatus(
            status=_STATUS[s["state"]],
            step=s["step"],
            total_steps=s["total_steps"],
            model_version=common_pb2.ModelVersion(
                version=s["model_version"], step=s["step"], checkpoint_path=s["last_checkpoint"]
            ),
            world_size=s["world_size"],
            last_checkpoint=s["last_checkpoint"],
            last_metrics=s["last_metrics"],
        )

    async def IsAlive(self, request, context):
        return trainer_pb2.IsAliveResponse(
            alive=self.core.state not in (TrainerState.STOPPED, TrainerState.FAILED)
        )

    async def Shutdown(self, request, context):
        if self.core.state is TrainerState.STOPPED:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "trainer is already stopped")
        await self.weight_sync.close()
        await self.core.shutdown(wait_for_save=request.wait_for_save)
        if self.on_shutdown is not None:
            asyncio.get_running_loop().call_soon(self.on_shutdown)
        return trainer_pb2.ShutdownResponse()


def registration(servicer: TrainerServicer) -> Registration:
    return (
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        servicer,
        trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name,
    )
