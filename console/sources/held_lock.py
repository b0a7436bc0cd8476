"""A host's lock as this console holds it, shared by the presence board (whose beat checks it is still
ours, and whose leave releases it) and the host lock (which takes and releases it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from console.core.pairing import LockInfo

__all__ = ["Lock", "ReleasesLocks"]


class ReleasesLocks(Protocol):
    """Whoever gave the lock (`host_lock.HostLock`): a protocol, so this module imports none of it."""

    async def release(self, lock: Lock | None = None) -> bool: ...


@dataclass
class Lock:
    """A lock this console holds. `lost` turns True when a heartbeat finds it gone (broken by someone
    who judged this console dead): whoever holds it must stop changing the service."""

    info: LockInfo
    locks: ReleasesLocks
    lost: bool = False
    released: bool = False

    async def release(self) -> bool:
        return await self.locks.release(self)
