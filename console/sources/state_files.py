"""Files other features keep in a host's state directory (the commit-confirmed rollback's record and
script), written atomically by the state directory's scripts."""

from __future__ import annotations

from console.sources import hoststate_scripts as hs
from console.sources.state_runner import StateRunner

__all__ = ["StateFiles"]


class StateFiles:
    """Files by name in one host's state directory."""

    def __init__(self, runner: StateRunner) -> None:
        self.runner = runner

    async def absolute_path(self) -> str:
        _, lines = await self.runner.run(hs.WHERE, what="find the state directory")
        return next((line[4:] for line in lines if line.startswith("dir ")), self.runner.path)

    async def put(self, name: str, text: str, mode: str = "600") -> str:
        """Write `name` in the state directory atomically; its absolute path on the host."""
        await self.runner.run(hs.PUT_FILE, name, text, mode, what=f"write {name}")
        return f"{await self.absolute_path()}/{name}"

    async def remove(self, name: str) -> None:
        await self.runner.run(hs.REMOVE_FILE, name, what=f"remove {name}")
