"""Errors of the synchronizer core; the servicer maps each to one gRPC status code."""

from __future__ import annotations


class SynchronizerError(RuntimeError):
    """Base class."""


class NotRegistered(SynchronizerError):
    """The member id is unknown or was marked LOST: register again (NOT_FOUND)."""


class NotKept(SynchronizerError):
    """The weights asked for are not kept: none pushed yet, or not the latest version (NOT_FOUND)."""


class WrongState(SynchronizerError):
    """The call is not allowed now: stale version, wrong role, no group yet (FAILED_PRECONDITION)."""


class InvalidArgument(SynchronizerError, ValueError):
    """A request field is out of range; the message names it (INVALID_ARGUMENT)."""
