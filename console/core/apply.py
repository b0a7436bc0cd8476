"""The pure half of `apply`: the argv a host will run, the post-restart verdict, and the models the service
controller reports with. No I/O (sources/service does the work). The planner's verdict on a profile is
the planning brain's (core.planning), re-exported here for the controller and the screens.

The argv a host runs is the profile's, with two things the host decides rather than the profile:

- a bare program name (`python3`, the shipped profiles' spelling) means "this host's python": when the
  unit runs the same module (`-m sglang.launch_server`) with an interpreter of its own (a venv's
  `/opt/sglang/bin/python3`), that interpreter is kept. An absolute path in a profile is used as written.
- `--host` and `--port` stay as the unit has them: the console, its tunnel and anything in front of the
  server reach it there (`server_url` in hosts.toml), so a profile written for another host cannot move it.
Both are said in the preview when they change what the profile asked for.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from console.core.confirm import PendingRollback
from console.core.events import Error
from console.core.flags import (
    FlagList,
    UnknownVersion,
    load_flag_list,
    parse_argv,
    split_command,
)
from console.core.planning import PlannerVerdict, planner_verdict
from console.core.profiles import Profile, diff_against_argv
from console.core.state import Boot

HOST_BOUND_FLAGS = ("--host", "--port")
"""Flags whose value the host's unit keeps (see the module docstring)."""

DEFAULT_MIN_FREE_GIB = 1.0
"""Least GPU memory left free at ready for a restart to verify: what long prefills' activations need once
CUDA graphs are captured (the planner's 3 GiB floor is the slack *before* the graphs take theirs)."""


# --------------------------------------------------------------------------------------------------
# Models the controller reports with (the API of sources/service)
# --------------------------------------------------------------------------------------------------


class ApplyProgress(BaseModel, defer_build=True):
    """Sent to a callback as the apply goes: one per phase change."""

    phase: str
    """A console.core.restart.Phase value."""
    label: str
    message: str | None = None
    elapsed_s: float
    durations: dict[str, float] = Field(default_factory=dict)
    """Phase → seconds so far (the open phase counts up to now)."""
    eta_s: float | None = None
    purpose: Literal["apply", "rollback"] = "apply"


class ApplyPreview(BaseModel, defer_build=True):
    """Everything decided before the host is touched."""

    profile: str
    host: str = ""
    unit: str = ""
    ok: bool
    """Validation and the planner allow it (without force)."""
    valid: bool = True
    """The flags are valid for the profile's SGLang version (a planner refusal can be forced; this cannot)."""
    planner_refused: bool = False
    errors: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    diff: list[str] = Field(default_factory=list)
    """Human diff lines against the running ExecStart; empty when the unit already runs this argv."""
    predicted_pool_tokens: int | None = None
    headroom_gib: float | None = None
    fits: bool | None = None
    planner: PlannerVerdict | None = None
    running_argv: list[str] = Field(default_factory=list)
    new_argv: list[str] = Field(default_factory=list)
    dropin_path: str = ""
    program_changed: bool = False
    """The unit would run another program (the words before the flags differ, e.g. `/bin/sh -c …` for
    `python3 -m sglang.launch_server`): confirmed only by typing the profile's name, or with --yes."""

    @property
    def unchanged(self) -> bool:
        return self.running_argv == self.new_argv

    @property
    def needs_name(self) -> bool:
        """A yes is not enough: the operator types the profile's name (or passes --yes)."""
        return self.planner_refused or self.program_changed


def forced_reason(pv: ApplyPreview, how: str) -> str | None:
    """Why a change went past a refusal, and `how` the operator said so ("forced with --yes"), for the
    audit trail; None when nothing was refused."""
    if not pv.needs_name:
        return None
    why = "the planner refused it" if pv.planner_refused else "it changes the program the unit runs"
    return f"{why}; {how}"


class ApplyOutcome(BaseModel, defer_build=True):
    ok: bool
    """The verification held."""
    profile: str
    summary: str
    """One line for the operator."""
    outcome: str = ""
    """The RestartMachine outcome: verified, not_verified, failed, refused, unchanged."""
    pool_tokens: int | None = None
    headroom_gib: float | None = None
    """GPU memory free at ready (GiB), as the server reported it."""
    durations: dict[str, float] = Field(default_factory=dict)
    total_s: float = 0.0
    reasons: list[str] = Field(default_factory=list)
    diff: list[str] = Field(default_factory=list)
    recorded_in: str | None = None
    """The profile file the verified numbers went into."""
    rolled_back: bool = False
    rollback: ApplyOutcome | None = None
    pending_rollback: PendingRollback | None = None
    """A host-side rollback still armed when the apply ended (commit-confirmed, not confirmed)."""


# --------------------------------------------------------------------------------------------------
# The post-restart verdict (shared with `verify`)
# --------------------------------------------------------------------------------------------------


class Verdict(BaseModel, defer_build=True):
    """The `verify --json` contract."""

    ok: bool
    max_total_num_tokens: int | None
    target_context: int
    ready: bool
    errors: list[dict[str, Any]] = Field(default_factory=list)
    stale_errors: list[dict[str, Any]] = Field(default_factory=list)
    available_gpu_mem_gb: float | None = None
    phase: str
    boot_index: int
    """The boot's place among the boots read (the journal's backlog): not an identity, see `boot`."""
    boot: str = ""
    """`boot 03:19:50`, the time of its first journal line: as the console and `snapshot` name it."""
    boot_first_ts: str | None = None
    boots: int
    reasons: list[str] = Field(default_factory=list)
    summary: str = ""


def _error_dict(error: Error, boot: Boot) -> dict[str, Any]:
    return {
        "boot": boot.index,
        "ts": error.ts,
        "rank": f"TP{error.tp_rank}" if error.tp_rank is not None else None,
        "category": error.category,
        "message": error.message,
    }


_NUMBER = re.compile(r"\d+(?:\.\d+)?")
MESSAGE_SHOWN = 160
"""Characters of an error's message a verdict's sentence quotes (the JSON keeps it whole)."""


def grouped_errors(errors: Sequence[Error], boot: Boot) -> list[dict[str, Any]]:
    """One entry per error the ranks repeat (the same category and message but for its numbers: a
    GPU index, the memory free), first seen first, with `ranks` and `count`: `verify --json` listed the
    eight ranks' CUDA OOMs of one failed boot as eight ~580-character entries."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for e in errors:
        key = (e.category, _NUMBER.sub("#", e.message))
        entry = groups.get(key)
        if entry is None:
            entry = groups[key] = {**_error_dict(e, boot), "ranks": [], "count": 0}
        entry["count"] += 1
        if e.tp_rank is not None and f"TP{e.tp_rank}" not in entry["ranks"]:
            entry["ranks"].append(f"TP{e.tp_rank}")
    for entry in groups.values():
        entry["ranks"].sort(key=lambda r: int(r[2:]))
    return list(groups.values())


def _shortened(message: str) -> str:
    if len(message) <= MESSAGE_SHOWN:
        return message.rstrip(".")
    cut = message[:MESSAGE_SHOWN].rsplit(" ", 1)[0]
    return f"{cut.rstrip('.')}…"


def _errors_said(groups: Sequence[dict[str, Any]], total: int) -> str:
    """`9 error(s) since this boot: cuda_oom on TP0-TP7: CUDA out of memory. Tried… ; sigquit: …`."""
    parts = []
    for g in groups[:3]:
        ranks: list[str] = g["ranks"]
        where = f" on {ranks[0]}-{ranks[-1]} ({len(ranks)} ranks)" if len(ranks) > 1 else ""
        parts.append(f"{g['category']}{where}: {_shortened(g['message'])}")
    if len(groups) > 3:
        parts.append(f"{len(groups) - 3} more kind(s)")
    return f"{total} error(s) since this boot: " + "; ".join(parts)


def judge(boots: list[Boot], target: int) -> Verdict:
    """The verdict for the latest boot; errors of earlier boots are stale and do not fail it."""
    boot = boots[-1]
    tokens = boot.pool.tokens
    reasons: list[str] = []
    if tokens is None:
        reasons.append("the latest boot has not sized its KV pool yet")
    elif tokens < target:
        reasons.append(
            f"the pool holds {tokens:,} tokens, {target - tokens:,} short of the {target:,} target "
            "(raise --mem-fraction-static; --context-length alone does not grow the pool)"
        )
    if boot.ended:
        reasons.append(f"the server {boot.phase} after this boot's start")
    elif not boot.ready:
        reasons.append(f"the server is not ready (it got as far as: {boot.phase})")
    errors = grouped_errors(boot.errors, boot)
    if boot.errors:
        reasons.append(_errors_said(errors, len(boot.errors)))
    stale = [entry for b in boots[:-1] for entry in grouped_errors(b.errors, b)]
    room = boot.pool.available_gpu_mem_gb
    if reasons:
        summary = "not ok: " + "; ".join(reasons) + "."
    else:
        parts = [
            f"ok: the pool holds {tokens:,} tokens (target {target:,})",
            "the server is ready",
            "no errors since this boot",
        ]
        if room is not None:
            parts.append(f"{room:.2f} GiB free at ready")
        if stale:
            parts.append(f"{sum(e['count'] for e in stale)} stale error(s) from earlier boots ignored")
        summary = ", ".join(parts) + "."
    return Verdict(
        ok=not reasons,
        max_total_num_tokens=tokens,
        target_context=target,
        ready=boot.ready,
        errors=errors,
        stale_errors=stale,
        available_gpu_mem_gb=room,
        phase=boot.phase,
        boot_index=boot.index,
        boot=boot.name,
        boot_first_ts=boot.first_ts,
        boots=len(boots),
        reasons=reasons,
        summary=summary,
    )


# --------------------------------------------------------------------------------------------------
# The argv the host will run
# --------------------------------------------------------------------------------------------------


def _flag_key(profile: Profile, flag_list: FlagList, option: str) -> str | None:
    """The profile key that sets `option` (any alias or abbreviation), if any."""
    for key in profile.flags:
        try:
            res = flag_list.resolve("--" + key.removeprefix("--"))
        except ValueError:
            continue
        if res.spec is not None and res.spec.flag == option:
            return key
    return None


def profile_differences(profile: Profile, running_argv: Sequence[str]) -> tuple[str, ...] | None:
    """How the running argv differs from what `apply` would write for `profile` (the diff lines; empty
    when the unit runs it), or None when the profile's SGLang version has no flag list to judge by.
    A probe's results belong to a profile only when this is empty."""
    try:
        flag_list = load_flag_list(profile.sglang_version)
    except UnknownVersion:
        return None
    hosted, _ = host_profile(profile, flag_list, running_argv)
    return tuple(diff_against_argv(running_argv, hosted, flag_list).lines())


def why_not_running(profile: Profile, running_argv: Sequence[str]) -> str | None:
    """None when the unit runs `profile` as `apply` writes it; otherwise why not, in words."""
    diff = profile_differences(profile, running_argv)
    if diff is None:
        return f"{profile.name} names an SGLang version without a flag list"
    if diff:
        shown = "; ".join(diff[:3]) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")
        return f"the unit runs other flags than {profile.name} ({shown})"
    return None


def host_profile(profile: Profile, flag_list: FlagList, running: Sequence[str]) -> tuple[Profile, list[str]]:
    """The profile as this host will run it (module docstring), with one note per thing the host kept."""
    notes: list[str] = []
    command, words = split_command(running) if running else ([], [])
    new_command = list(profile.command)
    if (
        command
        and "/" not in new_command[0]
        and command[0] != new_command[0]
        and command[1:] == new_command[1:]
        and posixpath.basename(command[0]).startswith(
            posixpath.basename(new_command[0]).rstrip("0123456789.")
        )
    ):
        notes.append(
            f"the profile's {new_command[0]} runs as the unit's own interpreter {command[0]} "
            "(write an absolute path in the profile's command to change it)."
        )
        new_command[0] = command[0]
    running_flags = parse_argv(words, flag_list).values
    flags: dict[str, Any] = dict(profile.flags)
    for option in HOST_BOUND_FLAGS:
        kept = running_flags.get(option)
        if not isinstance(kept, tuple) or len(kept) != 1:
            continue
        key = _flag_key(profile, flag_list, option)
        asked = flags.get(key) if key is not None else None
        if asked is not None and str(asked) == kept[0]:
            continue
        if key is not None:
            del flags[key]
        flags[option.removeprefix("--")] = (
            int(kept[0]) if option == "--port" and kept[0].isdigit() else kept[0]
        )
        if asked is not None:
            notes.append(
                f"{option} stays {kept[0]} as the unit has it (the profile says {asked}; the console and "
                "server_url in hosts.toml reach the server there)."
            )
    return profile.model_copy(update={"command": new_command, "flags": flags}), notes


__all__ = [
    "DEFAULT_MIN_FREE_GIB",
    "HOST_BOUND_FLAGS",
    "ApplyOutcome",
    "ApplyPreview",
    "ApplyProgress",
    "PlannerVerdict",
    "Verdict",
    "host_profile",
    "judge",
    "planner_verdict",
]


def argv_word_diff(before: Sequence[str], after: Sequence[str]) -> list[str]:
    """What changes between two ExecStart argvs, flag by flag ("- --mem-fraction-static 0.97", "+
    --mem-fraction-static 0.85"); a changed program is one pair of lines. No flag list is needed: a
    flag's value is the words that follow it up to the next `--` word, as a rollback's preview reads it."""

    def flags(argv: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        command, words = split_command(argv)
        out: dict[str, str] = {}
        key: str | None = None
        for word in words:
            if word.startswith("--"):
                key, _, inline = word.partition("=")
                out[key] = f"{key}={inline}" if inline else key
            elif key is not None:
                out[key] += f" {word}"
        return command, out

    (cmd_a, a), (cmd_b, b) = flags(before), flags(after)
    lines: list[str] = []
    if cmd_a != cmd_b:
        lines += [f"- {shlex.join(cmd_a)}", f"+ {shlex.join(cmd_b)}"]
    for key in dict.fromkeys([*a, *b]):
        if a.get(key) == b.get(key):
            continue
        if key in a:
            lines.append(f"- {a[key]}")
        if key in b:
            lines.append(f"+ {b[key]}")
    return lines


class RollbackPreview(BaseModel, defer_build=True):
    """Where a rollback takes the unit, before it is done: the drop-in it puts back (or that the unit's
    own ExecStart comes back), and the flags that change."""

    host: str
    unit: str
    target: str
    """In words: "the drop-in kept by the last apply", "the unit's own ExecStart (no drop-in by the console)"."""
    past_first: bool
    """The rollback removes the console's only drop-in: it needs the operator's explicit word."""
    running_argv: list[str] = Field(default_factory=list)
    new_argv: list[str] = Field(default_factory=list)
    diff: list[str] = Field(default_factory=list)
