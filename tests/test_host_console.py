"""The console shows what it learned of the host (issue 21): the header names the SGLang the host runs and
the KV cell of the model's own config.json, and the profile editor checks a profile against the flag list
of that SGLang, saying which of its flags differ when it was written for another version."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from console.core.flags import load_flag_list
from console.sources.hosts import load_hosts
from console.sources.session_options import SessionOptions
from console.tui.app import ConsoleApp, HostEntry
from console.tui.profile_check import check_profile_text
from console.twin.host import TwinHost
from console.twin.sglang_tree import WHEEL_VERSION, find_wheel
from tests.support.cli import CTX200K
from tests.support.twins import module_twin
from tests.tui_support import plain

needs_wheel = pytest.mark.skipif(
    find_wheel() is None,
    reason=f"the SGLang {WHEEL_VERSION} wheel is not cached in .cache/sglang-wheel (run scripts/fetch-sglang-wheel)",
)


def test_a_profile_for_another_sglang_is_checked_against_the_hosts_and_says_what_differs() -> None:
    host_flags = load_flag_list("v0.5.23")
    old = CTX200K.replace('sglang_version = "v0.5.12.post1"', 'sglang_version = "v0.4.6.post5"')
    check = check_profile_text(old, "ctx-200k", host_flags=host_flags)
    said = [i for i in check.issues if i.where == "sglang_version"]
    assert said and said[0].level == "warning"
    assert "written for SGLang v0.4.6.post5; the host runs v0.5.23" in said[0].message
    # without the host's list the same text is checked against its own version only: no such warning
    alone = check_profile_text(old, "ctx-200k")
    assert not [i for i in alone.issues if i.where == "sglang_version"]
    # written for the version the host runs: nothing to say about versions
    same = check_profile_text(CTX200K, "ctx-200k", host_flags=load_flag_list("v0.5.12.post1"))
    assert not [i for i in same.issues if i.where == "sglang_version"]


def test_a_profile_naming_an_unknown_version_is_checked_against_the_hosts_list() -> None:
    text = CTX200K.replace('sglang_version = "v0.5.12.post1"', 'sglang_version = "v9.9.9"')
    assert not check_profile_text(text, "x").ok  # no list for v9.9.9: an error on its own
    check = check_profile_text(text, "x", host_flags=load_flag_list("v0.5.12.post1"))
    assert check.ok, check.issues
    (said,) = [i for i in check.issues if i.where == "sglang_version"]
    assert (
        said.level == "warning"
        and "checked against SGLang v0.5.12.post1, which the host runs" in said.message
    )


twin = module_twin("host-console", time_scale=0.002)


@needs_wheel
async def test_the_console_learns_the_host_and_its_header_and_editor_use_it(
    twin: TwinHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = load_hosts(twin.hosts_toml).get(twin.name)
    assert config is not None
    entry = HostEntry(
        twin.name,
        config=config,
        learn=True,
        session=SessionOptions(gpu_interval_s=0.5, server_interval_s=0.5),
        restart_history_dir=tmp_path / "ctl",
    )
    app = ConsoleApp([entry])
    async with app.run_test(size=(160, 48)) as pilot:
        host = app.hosts[twin.name]
        deadline = time.monotonic() + 90
        while host.facts is None:
            assert time.monotonic() < deadline, "the console never learned the host"
            await pilot.pause(0.1)
        assert host.facts.sglang.version == WHEEL_VERSION
        assert host.facts.flags.flags_from == "host"
        assert host.host_flags is not None and host.host_flags.sglang_version.endswith(WHEEL_VERSION)
        await pilot.pause(0.2)
        header = plain(app.dashboards[twin.name].header.render(), 160)
        assert "70,272 B/token (host)" in header
        assert host.host_view().host_flags is host.host_flags  # what the profile editor checks against


@needs_wheel
async def test_apply_checks_a_profile_against_the_sglang_the_host_runs(
    twin: TwinHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from console.core.profiles import parse_profile
    from console.sources.service import ServiceController
    from console.sources.transport import Transport

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = load_hosts(twin.hosts_toml).get(twin.name)
    assert config is not None
    text = CTX200K.replace('sglang_version = "v0.5.12.post1"', 'sglang_version = "v0.4.6.post5"')
    old = parse_profile(text, name="ctx-200k")
    transport = Transport(config)
    try:
        ctl = ServiceController(config, transport, state_dir=tmp_path / "ctl")
        before = await ctl.preview(old)  # nothing learned: the profile's own version's list, as before
        assert not any("the host runs" in w for w in before.warnings)
        await ctl.learn_host_flags()
        assert ctl.host_flags is not None and ctl.host_flags.sglang_version.endswith(WHEEL_VERSION)
        after = await ctl.preview(old)
        assert any(
            f"written for SGLang v0.4.6.post5; the host runs v{WHEEL_VERSION}" in w for w in after.warnings
        )
        same = await ctl.preview(parse_profile(CTX200K, name="ctx-200k"))
        assert not any("the host runs" in w for w in same.warnings)
    finally:
        await transport.close()
