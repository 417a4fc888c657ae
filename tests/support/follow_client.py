"""A scripted synchronizer client for the follow loop's tests (services/weight_sync/member/follow.py):
`wait_for_version` answers from a queue (an exception in it is raised instead), and the asks, the
load reports and the registrations are recorded. It has what the loop and its callers use of
`SyncClient`: wait_for_version, report_load, register, model_version."""

from __future__ import annotations

import asyncio

import grpc
from rft.v1 import common_pb2, synchronizer_pb2


def answer(version: int, *, finished: bool = False, timed_out: bool = False, generation: int = 0):
    return synchronizer_pb2.WaitForVersionResponse(
        model_version=common_pb2.ModelVersion(version=version),
        finished=finished,
        timed_out=timed_out,
        generation=generation,
    )


def rpc_error(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=code.name)


class FollowClient:
    """Answers WaitForVersion from `answers` in order; `failing_reports` report_load calls fail
    UNAVAILABLE (each one is still recorded)."""

    def __init__(self, answers, model_version: int = 0, failing_reports: int = 0):
        self.answers: asyncio.Queue = asyncio.Queue()
        for a in answers:
            self.answers.put_nowait(a)
        self.model_version = model_version
        self.failing_reports = failing_reports
        self.asked: list[int] = []
        self.reports: list[tuple[int, bool]] = []
        self.messages: list[str] = []
        self.registered = 0

    async def wait_for_version(self, step=0, min_version=0, timeout_s=None):
        self.asked.append(min_version)
        got = await self.answers.get()
        if isinstance(got, BaseException):
            raise got
        return got

    async def report_load(self, version, ok=True, generation=0, message="", within_s=None):
        self.reports.append((version, ok))
        self.messages.append(message)
        if self.failing_reports:
            self.failing_reports -= 1
            raise rpc_error(grpc.StatusCode.UNAVAILABLE)

    async def register(self, step=None, model_version=None):
        self.registered += 1
