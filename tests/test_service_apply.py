"""The safe restart against a twin over SSH (issue 6): apply, refuse, force into an OOM and roll back,
an SSH connection dropped mid-restart, sudo.

One twin (the incident's scenario: 8x RTX PRO 6000 at --mem-fraction-static 0.85, 101,134 tokens) serves
the module at a tiny time scale. Each test gets it as a fresh twin is (no drop-in, the shipped flags
running) and a working directory of its own, so the tests pass alone and in any order.
"""

from __future__ import annotations

import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.core.parser import parse_lines
from console.core.profiles import Profile
from console.core.restart import Phase
from console.core.state import fold_boots
from console.sources.hosts import HostConfig, load_hosts
from console.sources.journal import read_unit_journal
from console.sources.profile_store import ProfileStore
from console.sources.service import ApplyProgress, ServiceController, ServiceError, history_path
from console.sources.transport import Transport
from console.twin.host import TwinHost
from tests.support.cli import wait_until

REPO = Path(__file__).resolve().parent.parent
TIME_SCALE = 0.002


@pytest.fixture(scope="module")
def module_twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
    host = TwinHost(tmp_path_factory.mktemp("apply-twin") / "state", time_scale=TIME_SCALE)
    host.start_sync()
    try:
        yield host
    finally:
        host.stop_sync()


@pytest.fixture
def twin(module_twin: TwinHost) -> TwinHost:
    """The module's twin put back as it started, whatever an earlier test applied: no drop-in, the unit
    restarted on its shipped flags (the restart returns once /health answers)."""
    dropins = module_twin.layout.unit_dir / f"{module_twin.unit}.d"
    if dropins.exists():
        shutil.rmtree(dropins)
        module_twin.systemctl("daemon-reload")
        module_twin.systemctl("restart", module_twin.unit)
    return _at_rest(module_twin)


def _at_rest(twin: TwinHost) -> TwinHost:
    """The unit active, not still in its ExecStartPost= health wait: an apply verifies on the server's
    ready line, while the unit may still be "activating", and a test compares the unit's state before and
    after."""
    assert wait_until(lambda: twin.systemctl("is-active", twin.unit, check=False).stdout == "active\n", 60), (
        twin.systemctl("status", twin.unit, check=False).stdout
    )
    return twin


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The test's own profile stores and console state (its restart history)."""
    return tmp_path


def _host(twin: TwinHost, **changes: object) -> HostConfig:
    host = load_hosts(twin.hosts_toml).get(twin.name)
    assert host is not None
    return host.model_copy(update=changes)


def _store(work: Path, name: str, text: str | None = None) -> ProfileStore:
    """A profile directory of the test's own, holding a copy of a shipped profile (or `text`)."""
    d = work / f"profiles-{name}"
    d.mkdir(exist_ok=True)
    if text is None:
        shutil.copy(REPO / "profiles" / f"{name}.toml", d / f"{name}.toml")
    else:
        (d / f"{name}.toml").write_text(text)
    return ProfileStore([d])


def _variant(name: str, **flags: object) -> str:
    """ctx-200k's text with some flags changed, under another name."""
    text = (REPO / "profiles" / "ctx-200k.toml").read_text()
    text = text.replace('name = "ctx-200k"', f'name = "{name}"')
    for key, value in flags.items():
        lines = text.splitlines()
        for i, line in enumerate(lines):
            if line.startswith(f"{key} ="):
                lines[i] = f"{key} = {value}"
        text = "\n".join(lines) + "\n"
    return text


def _host_state(twin: TwinHost) -> tuple[dict[str, str], str]:
    """The drop-in directory's files and the unit's invocation: what 'the host unchanged' compares."""
    _settled(twin)
    d = twin.layout.unit_dir / f"{twin.unit}.d"
    files = {p.name: p.read_text() for p in sorted(d.iterdir())} if d.is_dir() else {}
    invocation = twin.systemctl("show", "-p", "InvocationID,ActiveState", twin.unit).stdout
    return files, invocation


async def _boots(transport: Transport, unit: str) -> int:
    return len(fold_boots(parse_lines(await read_unit_journal(transport, unit))))


async def test_apply_ctx200k_one_restart_verified_and_recorded(twin: TwinHost, work: Path) -> None:
    store = _store(work, "ctx-200k")
    profile = store.load("ctx-200k")
    seen: list[ApplyProgress] = []
    async with Transport(_host(twin)) as transport:
        ctl = ServiceController(_host(twin), transport, state_dir=work / "state")
        running = await ctl.running_argv()
        assert (
            "--mem-fraction-static" in running
            and running[running.index("--mem-fraction-static") + 1] == "0.85"
        )
        boots_before = await _boots(transport, ctl.unit)

        pv = await ctl.preview(profile)
        assert pv.ok and pv.fits and pv.planner is not None and pv.planner.calibration == "exact"
        assert pv.predicted_pool_tokens is not None and 200_000 <= pv.predicted_pool_tokens < 215_000
        assert "~ --mem-fraction-static 0.85 → 0.93" in pv.diff
        # The host keeps its interpreter and its port; the preview says so.
        assert pv.new_argv[0] == running[0] and any("--port stays" in n for n in pv.notes)

        outcome = await ctl.apply(profile, progress=seen.append, store=store)
        assert outcome.ok, outcome.summary
        assert outcome.pool_tokens is not None and outcome.pool_tokens >= 200_000
        assert outcome.summary.startswith(f"verified: pool {outcome.pool_tokens:,} tokens ≥ 200,000")
        # One restart: exactly one boot more in the unit's journal, running the new argv.
        assert await _boots(transport, ctl.unit) == boots_before + 1
        assert await ctl.running_argv() == pv.new_argv

    phases = [p.phase for p in seen]
    for a, b in zip(
        ["validate", "diff", "write_dropin", "daemon_reload", "restart", "loading_weights", "kv_pool"],
        ["diff", "write_dropin", "daemon_reload", "restart", "loading_weights", "kv_pool", "cuda_graphs"],
        strict=True,
    ):
        assert phases.index(a) < phases.index(b), phases
    assert list(dict.fromkeys(phases))[-3:] == ["verify", "record", "done"]
    assert any(p.message and "recorded in" in p.message for p in seen)
    assert set(outcome.durations) >= {"loading_weights", "kv_pool", "cuda_graphs", "restart"}
    assert all(v >= 0 for v in outcome.durations.values())

    # The profile file: the verified numbers, and every comment of the operator still there.
    text = (store.dirs[0] / "ctx-200k.toml").read_text()
    original = (REPO / "profiles" / "ctx-200k.toml").read_text()
    for line in original.splitlines():
        if "#" in line:
            assert line in text, line
    verified = tomllib.loads(text)["verified"]
    assert verified["pool_tokens"] == outcome.pool_tokens and verified["host"] == "twin"
    assert verified["headroom_gib"] == pytest.approx(outcome.headroom_gib, abs=0.01)
    # The drop-in is where hosts.toml says, with no backup (there was no drop-in before).
    d = twin.layout.unit_dir / f"{twin.unit}.d"
    assert sorted(p.name for p in d.iterdir()) == ["50-k26-console.conf"]
    assert history_path("twin", work / "state").read_text().count("\n") == 1


async def test_no_headroom_is_refused_then_forced_into_oom_and_rolled_back(
    twin: TwinHost, work: Path
) -> None:
    store = _store(work, "tight", _variant("tight", **{"mem-fraction-static": "0.97"}))
    profile = store.load("tight")
    async with Transport(_host(twin)) as transport:
        ctl = ServiceController(_host(twin), transport, state_dir=work / "state")
        # A verified ctx-200k first: a drop-in to roll back to, and a restart in this host's history for
        # the rollback's ETA.
        ctx200k = _store(work, "ctx-200k")
        assert (await ctl.apply(ctx200k.load("ctx-200k"), store=ctx200k)).ok
        before_argv = await ctl.running_argv()
        before = _host_state(_at_rest(twin))

        pv = await ctl.preview(profile)
        assert pv.valid and pv.planner_refused and not pv.ok and pv.fits is False
        assert any("headroom" in e and "under the 3 GiB" in e for e in pv.errors), pv.errors

        refused = await ctl.apply(profile, store=store)
        assert not refused.ok and refused.outcome == "refused"
        assert refused.summary.startswith("refused by the planner:")
        assert _host_state(twin) == before  # nothing written, nothing restarted

        seen: list[ApplyProgress] = []
        forced = await ctl.apply(
            profile, force=True, rollback_on_failure=True, progress=seen.append, store=store
        )
        assert not forced.ok and forced.outcome == "failed"
        assert any("cuda_oom" in r or "out of memory" in r.lower() for r in forced.reasons), forced.reasons
        assert forced.rolled_back and forced.rollback is not None
        assert forced.rollback.ok, forced.rollback.summary
        assert forced.rollback.outcome == "verified"
        # Named after where it went, and verified against the target in force after it: ctx-200k's,
        # not the pool against itself ("pool 218,484 ≥ 218,484"; "rolled back to rollback").
        assert forced.rollback.profile == "ctx-200k"
        assert "Rolled back to ctx-200k: verified." in forced.summary
        assert forced.rollback.summary.startswith("verified: pool "), forced.rollback.summary
        assert "tokens ≥ 200,000 (ctx-200k's target), ready" in forced.rollback.summary
        # Back to exactly what ran before: the same argv and the same drop-in text.
        assert await ctl.running_argv() == before_argv
        files, _ = _host_state(twin)
        assert files == before[0]
        # The rollback's restart had an ETA from the earlier verified restarts of this host.
        rollback_boot = [p for p in seen if p.purpose == "rollback" and p.phase == Phase.LOADING_WEIGHTS]
        assert rollback_boot and rollback_boot[0].eta_s is not None
    assert tomllib.loads((store.dirs[0] / "tight.toml").read_text()).get("verified", {}) == {}


async def test_ssh_dropped_mid_restart_still_verifies(twin: TwinHost, work: Path) -> None:
    store = _store(work, "ctx-200k-b", _variant("ctx-200k-b", **{"mem-fraction-static": "0.935"}))
    profile = store.load("ctx-200k-b")
    async with Transport(_host(twin)) as transport:
        ctl = ServiceController(_host(twin), transport, state_dir=work / "state")
        dropped: list[str] = []

        def progress(p: ApplyProgress) -> None:
            # Cut the connection as the weights load and again at the KV pool: the journal follower and
            # the controller must pick up where they were.
            if p.phase in (Phase.LOADING_WEIGHTS, Phase.KV_POOL) and p.phase not in dropped:
                dropped.append(p.phase)
                transport.drop()

        outcome = await ctl.apply(profile, progress=progress, store=store)
        assert dropped == ["loading_weights", "kv_pool"]
        assert transport.status.drops >= 2
        assert outcome.ok, outcome.summary
        assert outcome.pool_tokens is not None and outcome.pool_tokens >= 200_000
        argv = await ctl.running_argv()
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.935"


async def test_ssh_dropped_mid_restart_still_sees_the_oom(twin: TwinHost, work: Path) -> None:
    store = _store(work, "tight-b", _variant("tight-b", **{"mem-fraction-static": "0.975"}))
    profile = store.load("tight-b")
    async with Transport(_host(twin)) as transport:
        ctl = ServiceController(_host(twin), transport, state_dir=work / "state")
        before_argv = await ctl.running_argv()

        def progress(p: ApplyProgress) -> None:
            if p.phase == Phase.LOADING_WEIGHTS and p.purpose == "apply":
                transport.drop()

        outcome = await ctl.apply(
            profile, force=True, rollback_on_failure=True, progress=progress, store=store
        )
        assert not outcome.ok and outcome.outcome == "failed"
        assert outcome.rollback is not None and outcome.rollback.ok
        assert await ctl.running_argv() == before_argv
        # No drop-in was kept: the rollback removed the console's, and says so; with no target in force
        # it is held to the pool the apply started from.
        assert outcome.rollback.profile == "the unit's own ExecStart"
        assert "Rolled back to the unit's own ExecStart: verified." in outcome.summary
        assert ", as before the apply, ready" in outcome.rollback.summary, outcome.rollback.summary


async def test_sudo_needs_a_password_is_one_sentence_and_changes_nothing(twin: TwinHost, work: Path) -> None:
    store = _store(work, "ctx-128k")
    profile = store.load("ctx-128k")
    host = _host(twin, sudo=True)
    before = _host_state(twin)
    marker = twin.layout.sudo_nopasswd
    saved = marker.read_text()
    marker.unlink()
    try:
        async with Transport(host) as transport:
            ctl = ServiceController(host, transport, state_dir=work / "state")
            with pytest.raises(ServiceError) as err:
                await ctl.apply(profile, store=store)
    finally:
        marker.write_text(saved)
    assert err.value.bad_input
    assert str(err.value).startswith("sudo on twin needs a password")
    assert "\n" not in str(err.value)
    assert _host_state(twin) == before


def test_profiles_used_here_exist() -> None:
    # The shipped profiles these tests copy are the ones the README's apply command names.
    for name in ("ctx-128k", "ctx-200k"):
        Profile.model_validate(tomllib.loads((REPO / "profiles" / f"{name}.toml").read_text()))


async def test_rollback_without_a_drop_in_is_refused(tmp_path: Path, twin: TwinHost) -> None:
    # A unit directory where k26-console never wrote: nothing to roll back, and it says so.
    host = _host(twin, unit_dir=str(tmp_path))
    async with Transport(host) as transport:
        ctl = ServiceController(host, transport, state_dir=tmp_path / "state")
        with pytest.raises(ServiceError, match="there is no drop-in by k26-console"):
            await ctl.rollback()


def test_history_is_per_host(tmp_path: Path) -> None:
    assert history_path("gpu-01", tmp_path) != history_path("gpu-02", tmp_path)
    assert history_path("a/b", tmp_path).parent == tmp_path / "restarts"


def _settled(twin: TwinHost) -> None:
    """Wait out a unit still between states (an earlier apply's ExecStartPost= health wait keeps it
    "activating" after the server's ready line): "active" against "activating" is not a change, while a
    restart shows in the InvocationID compared beside it."""
    moving = ("activating\n", "deactivating\n", "reloading\n")
    assert wait_until(lambda: twin.systemctl("is-active", twin.unit, check=False).stdout not in moving, 60), (
        twin.systemctl("status", twin.unit, check=False).stdout
    )
