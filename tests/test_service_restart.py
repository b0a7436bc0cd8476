"""`ServiceController.restart`: the plain restart of a twin over SSH, followed phase by phase and verified
like an apply, with nothing written to the host and no profile recorded (issue 9: `r` in the console).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from console.core.audit import AuditEntry
from console.core.pairing import Identity
from console.core.parser import parse_lines
from console.core.state import fold_boots
from console.sources.hosts import HostConfig, load_hosts
from console.sources.journal import read_unit_journal
from console.sources.service import ApplyProgress, ServiceController, ServiceError, history_path
from console.sources.transport import Transport
from console.twin.host import TwinHost
from tests.support.twins import module_twin

TIME_SCALE = 0.002
ME = Identity(user="alice", jump_host="jump1", pid=1, console_id="alice1")


twin = module_twin("restart-twin", time_scale=TIME_SCALE)


def _host(twin: TwinHost, **changes: object) -> HostConfig:
    host = load_hosts(twin.hosts_toml).get(twin.name)
    assert host is not None
    return host.model_copy(update=changes)


def _dropins(twin: TwinHost) -> dict[str, str]:
    d = twin.layout.unit_dir / f"{twin.unit}.d"
    return {p.name: p.read_text() for p in sorted(d.iterdir())} if d.is_dir() else {}


def _invocation(twin: TwinHost) -> str:
    return twin.systemctl("show", "-p", "InvocationID", twin.unit).stdout.strip()


async def test_restart_follows_the_boot_and_verifies_with_nothing_written(
    twin: TwinHost, tmp_path: Path
) -> None:
    seen: list[ApplyProgress] = []
    files = _dropins(twin)
    invocation = _invocation(twin)
    async with Transport(_host(twin)) as transport:
        ctl = ServiceController(_host(twin), transport, state_dir=tmp_path)
        argv = await ctl.running_argv()
        boots = len(fold_boots(parse_lines(await read_unit_journal(transport, ctl.unit))))
        outcome = await ctl.restart(progress=seen.append, expect_pool=101_134)
        assert outcome.ok, outcome.summary
        assert outcome.outcome == "verified" and outcome.profile == twin.unit
        # The incident's flags are still in force, so the pool is the incident's.
        assert outcome.pool_tokens == 101_134
        assert outcome.summary.startswith("verified: pool 101,134 tokens ≥ 101,134")
        after = fold_boots(parse_lines(await read_unit_journal(transport, ctl.unit)))
        assert len(after) == boots + 1
        assert await ctl.running_argv() == argv
    assert _invocation(twin) != invocation  # a new run of the unit
    assert _dropins(twin) == files  # nothing written
    phases = list(dict.fromkeys(p.phase for p in seen))
    for a, b in zip(
        ["validate", "restart", "loading_weights", "kv_pool", "cuda_graphs", "verify"],
        ["restart", "loading_weights", "kv_pool", "cuda_graphs", "verify", "done"],
        strict=True,
    ):
        assert phases.index(a) < phases.index(b), phases
    assert any(p.message and "nothing written" in p.message for p in seen)
    assert {"restart", "loading_weights", "kv_pool", "cuda_graphs"} <= set(outcome.durations)
    # The ETA of later restarts learns from this one; the audit line names the unit.
    assert history_path("twin", tmp_path).read_text().count("\n") == 1
    line = AuditEntry.from_outcome(outcome, me=ME, host="twin", ts=datetime.now(UTC), action="restart").line()
    assert line.startswith(f"alice restarted {twin.unit}; restart ") and "verified 101,134 tokens" in line


async def test_restart_expecting_a_larger_pool_is_not_verified(twin: TwinHost, tmp_path: Path) -> None:
    async with Transport(_host(twin)) as transport:
        ctl = ServiceController(_host(twin), transport, state_dir=tmp_path)
        outcome = await ctl.restart(expect_pool=200_000)
    assert not outcome.ok and outcome.outcome == "not_verified"
    assert outcome.pool_tokens == 101_134 and "200,000" in outcome.summary


async def test_restart_of_a_missing_unit_is_one_sentence_and_touches_nothing(
    twin: TwinHost, tmp_path: Path
) -> None:
    invocation = _invocation(twin)
    async with Transport(_host(twin)) as transport:
        ctl = ServiceController(_host(twin, unit="no-such.service"), transport, state_dir=tmp_path)
        with pytest.raises(ServiceError) as err:
            await ctl.restart()
    assert err.value.bad_input and "there is no unit no-such.service on twin" in str(err.value)
    assert _invocation(twin) == invocation
    assert not history_path("twin", tmp_path).exists()


def test_a_failed_boots_summary_cut_ends_in_its_ellipsis_not_in_a_full_stop_after_it() -> None:
    from console.sources.restart_follow import failed_summary

    oom = (
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 0.95 GiB. GPU 3 has a "
        "total capacity of 95.59 GiB of which 650.79 MiB is free. Including non-PyTorch memory, this process "
        "has 94.93 GiB memory in use."
    )
    cut = failed_summary(oom)
    assert cut.endswith("…") and "…." not in cut + " Rolled back to ctx-200k: verified."
    assert failed_summary("the server exited with status 1.") == "failed: the server exited with status 1."
    assert failed_summary(None) == "failed: the boot failed."
