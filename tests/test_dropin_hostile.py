"""Hostile flag values can never change the command (issue 6 §3).

Each argv is rendered into the drop-in by the console (`ServiceController.install`: written over SSH by the
remote script, daemon-reload, read back), then systemd starts the unit: the REAL systemd manager where this
machine can run one (console.twin.realsd: systemd's own reading of quoting, C escapes, `%` specifiers, `$`
expansion, `;` separators), and the twin's simulated one as well, so that the simulation is held to the
same answers. The server it starts writes the argv it received; that must be the argv intended, word for
word. The server is a few lines of Python that record `sys.argv`, so each example costs one restart of a
process, not a model load.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from console.sources.hosts import load_hosts
from console.sources.service import ServiceController
from console.sources.transport import Transport
from console.twin.host import TwinHost
from console.twin.layout import GpuInventory
from console.twin.realsd import why_unavailable

ARGV_SERVER = r"""
import json, os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
out = sys.argv[1]
with open(out + ".tmp", "w", encoding="utf-8") as fh:
    json.dump(sys.argv, fh)
os.replace(out + ".tmp", out)
while True:
    time.sleep(0.1)
"""

HOSTILE = [
    '"',
    "'",
    "a b",
    ";",
    " ; /bin/rm -rf /tmp/x",
    "$(touch /tmp/pwned)",
    "`id`",
    "$HOME",
    "${PATH}",
    "$$",
    "%n",
    "%%",
    "%",
    "100%",
    "line1\nline2",
    "\r",
    "\t",
    "back\\slash",
    "\\n",
    "\\x41",
    "\\",
    "é — ü 漢字 🙂",
    "\u2028",
    "\x85",
    "\x1b[31m",
    "--port",
    "",
    " ",
    "#not a comment",
    "[Service]",
    "ExecStart=/bin/false",
    "$$HOME",
    "%%n",
    "\\$HOME",
    "'$HOME'",
    '"${PATH}"',
    "%h%u%H",
    "x" * 12_000,
]

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24)
values = st.lists(st.one_of(st.sampled_from(HOSTILE), text), min_size=1, max_size=4)


MODES = ["simulated", *(["real"] if why_unavailable() is None else [])]


@pytest.fixture(scope="module", params=MODES)
def host(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[TwinHost, Path, Path]]:
    root = tmp_path_factory.mktemp("hostile")
    script = root / "argv_server.py"
    script.write_text(ARGV_SERVER)
    out = root / "argv.json"
    twin = TwinHost(
        root / "state",
        server_command=[sys.executable, str(script), str(out)],
        wait_ready=False,
        gpus=GpuInventory(name="NVIDIA RTX PRO 6000 Blackwell Server Edition", count=8, total_mib=97887),
        systemd=request.param,
    )
    twin.start_sync()
    assert twin.cfg is not None and twin.cfg.systemd == request.param
    try:
        yield twin, script, out
    finally:
        twin.stop_sync()


async def _run_on_twin(twin: TwinHost, argv: list[str], out: Path) -> list[str]:
    cfg = load_hosts(twin.hosts_toml).get(twin.name)
    assert cfg is not None
    async with Transport(cfg) as transport:
        ctl = ServiceController(cfg, transport)
        await ctl.install(argv, header=["hostile values, property test"])
        out.unlink(missing_ok=True)
        res = await transport.run(["systemctl", "restart", ctl.unit], timeout=60)
        assert res.ok, res.stderr
    deadline = time.monotonic() + 30
    while not out.exists():
        assert time.monotonic() < deadline, "the unit did not start the server"
        await asyncio.sleep(0.02)
    return json.loads(out.read_text(encoding="utf-8"))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=values)
@example(values=HOSTILE)
def test_hostile_values_reach_the_server_unchanged(
    host: tuple[TwinHost, Path, Path], values: list[str]
) -> None:
    twin, script, out = host
    argv = [sys.executable, str(script), str(out)]
    for i, v in enumerate(values):
        argv += [f"--flag-{i}", v]
    received = asyncio.run(_run_on_twin(twin, argv, out))
    # sys.argv[0] is the script; every word after it must be what was intended.
    assert received[1:] == argv[2:]
    assert received[0] == str(script)
