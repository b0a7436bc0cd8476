"""The console's drop-in of the unit on the host: `UNIT_DIR/UNIT.service.d/50-k26-console.conf`.

It is written by one remote `sh` script that reads the text from standard input (temp file in the same
directory, then rename, so systemd never reads half a file); the one it replaces is kept as
`50-k26-console.conf.previous` for the rollback, and put back when systemd does not read the new one
as intended.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from console.core.systemd import DROPIN_NAME, ExecStartError, render_dropin
from console.sources.unit_commands import ServiceError, UnitCommands

__all__ = ["BACKUP_SUFFIX", "DropinWriter"]

BACKUP_SUFFIX = ".previous"

# Exit codes of the write script, one per step, so the sentence names what failed.
_WRITE_STEPS = {
    10: "create the drop-in directory",
    11: "create a temporary file in the drop-in directory",
    12: "write the temporary file",
    13: "keep the previous drop-in as a backup",
    14: "rename the temporary file over the drop-in",
    15: "put the previous drop-in back",
    16: "remove the drop-in",
}

# $1 = the drop-in directory, $2 = the file name; the text arrives on stdin. Nothing is changed until the
# new text is safely in a temp file; a directory this script created is removed again on failure.
_WRITE_SCRIPT = r"""
dir=$1; name=$2; made=
fail() { code=$1; shift; rm -f -- "$tmp" "$bak"; [ -n "$made" ] && rmdir -- "$dir" 2>/dev/null; echo "$*" >&2; exit "$code"; }
tmp=; bak=
if [ ! -d "$dir" ]; then mkdir -p -- "$dir" 2>&1 >/dev/null | head -n 1 >&2; [ -d "$dir" ] || exit 10; made=1; fi
tmp=$(mktemp "$dir/.$name.XXXXXX" 2>/dev/null) || fail 11 "mktemp: cannot create a file in $dir: $(touch "$dir/.k26-probe" 2>&1 | sed 's/^touch: //' | head -n 1)"
err=$(cat 2>&1 > "$tmp") || fail 12 "cannot write $tmp: ${err#cat: }"
chmod 0644 "$tmp" || fail 12 "cannot chmod $tmp"
sync -- "$tmp" 2>/dev/null
if [ -f "$dir/$name" ]; then
  bak=$(mktemp "$dir/.$name.previous.XXXXXX") || fail 13 "cannot create a backup file in $dir"
  cp -p -- "$dir/$name" "$bak" && mv -f -- "$bak" "$dir/$name.previous" || fail 13 "cannot keep $dir/$name as $dir/$name.previous"
  bak=
else
  rm -f -- "$dir/$name.previous" || fail 13 "cannot remove the stale $dir/$name.previous"
fi
mv -f -- "$tmp" "$dir/$name" || fail 14 "cannot rename $tmp to $dir/$name"
"""

# $1 = the drop-in directory, $2 = the file name: put the backup back, or remove ours when there was none.
_RESTORE_SCRIPT = r"""
dir=$1; name=$2
if [ -f "$dir/$name.previous" ]; then
  mv -f -- "$dir/$name.previous" "$dir/$name" || exit 15
  echo restored
else
  rm -f -- "$dir/$name" || exit 16
  rmdir -- "$dir" 2>/dev/null
  echo removed
fi
"""

# $1 = the drop-in directory, $2 = the file name: what is there now.
_STATE_SCRIPT = r"""
dir=$1; name=$2
[ -f "$dir/$name" ] && echo dropin
[ -f "$dir/$name.previous" ] && echo previous
exit 0
"""


class DropinWriter(UnitCommands):
    """Writes, checks and restores the console's drop-in of the unit; never restarts it."""

    async def _dropin_state(self) -> set[str]:
        result = await self._run(["sh", "-c", _STATE_SCRIPT, "sh", self.dropin_dir, DROPIN_NAME])
        return set(result.stdout.split())

    async def _had_previous(self) -> bool:
        return "previous" in await self._dropin_state()

    async def install(self, argv: Sequence[str], *, header: Sequence[str] = ()) -> None:
        """Write the drop-in that makes the unit run `argv`, reload, and check systemd reads it back as
        exactly `argv` (else the previous drop-in is put back). Does not restart."""
        try:
            text = render_dropin(argv, header=header)
        except ExecStartError as exc:
            raise ServiceError(
                f"the command cannot be written as a systemd unit: {exc}.", bad_input=True
            ) from None
        await self.write_dropin(text)
        await self._reload_and_check(list(argv))

    async def write_dropin(self, text: str) -> None:
        """Temp file + rename on the host, the previous drop-in kept; a failure changes nothing."""
        result = await self._run(
            ["sh", "-c", _WRITE_SCRIPT, "sh", self.dropin_dir, DROPIN_NAME], privileged=True, input=text
        )
        if not result.ok:
            step = _WRITE_STEPS.get(result.exit_status or 0, "write the drop-in")
            detail = result.first_error_line()
            raise ServiceError(
                f"cannot {step} {self.dropin_dir} on {self.host.name}: {detail.rstrip('.')}"
                f"{self._write_hint(result.stderr)}; the host is unchanged.",
                bad_input=True,
            )

    def _write_hint(self, stderr: str) -> str:
        """What the operator can do about a failed write: root only helps against a permission refusal
        (a full disk or a read-only file system is not fixed by sudo)."""
        err = stderr.lower()
        if "no space left" in err or "disk quota exceeded" in err:
            return (
                f" (ENOSPC: the file system holding {self.dropin_dir} is full; free space there and run "
                "the apply again)"
            )
        if "read-only file system" in err:
            return f" (EROFS: {self.dropin_dir} is on a read-only file system)"
        if self.host.sudo or not ("permission denied" in err or "operation not permitted" in err):
            return ""
        return " (set sudo = true for this host in hosts.toml if it needs root)"

    async def _reload_and_check(self, intended: list[str]) -> None:
        """daemon-reload and read the unit back; on any doubt, put the previous drop-in back and reload."""
        try:
            await self._daemon_reload()
            info = await self.unit_info()
            problem = None
            if info.load_state != "loaded":
                problem = f"systemd does not load {self.unit} with it (LoadState={info.load_state})"
            else:
                reads = await self.running_argv()
                if reads != intended:
                    problem = "systemd reads its ExecStart= differently from the argv intended"
        except ServiceError as exc:
            problem = str(exc).rstrip(".")
        if problem is not None:
            await self._restore()
            with contextlib.suppress(ServiceError):
                await self._daemon_reload()
            raise ServiceError(
                f"the new drop-in was not accepted on {self.host.name}: {problem}; the previous drop-in is back "
                "and the service was not restarted."
            )

    async def _restore(self) -> str:
        result = await self._run(
            ["sh", "-c", _RESTORE_SCRIPT, "sh", self.dropin_dir, DROPIN_NAME], privileged=True
        )
        if not result.ok:
            step = _WRITE_STEPS.get(result.exit_status or 0, "restore the drop-in")
            raise ServiceError(
                f"cannot {step} in {self.dropin_dir} on {self.host.name}: {result.first_error_line()}."
            )
        return result.stdout.strip()
