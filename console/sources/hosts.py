"""The hosts file: which GPU hosts the console knows and how to reach them.

`hosts.toml` lives in the platform config dir (`platformdirs.user_config_dir("k26-console")`), or is
named with `--hosts FILE`. One table per host:

    [hosts.gpu1]
    ssh = "gpu1"                       # an ~/.ssh/config alias works as is; or "user@host"
    port = 22                          # optional; else ~/.ssh/config, else 22
    user = "ops"                       # optional; else ~/.ssh/config, else the local user
    unit = "sglang"                    # the systemd unit that runs the server (".service" optional)
    server_url = "http://127.0.0.1:30000"   # the SGLang URL as seen ON the GPU host
    model = "kimi-k2.6"                # optional model-spec override
    gpu = "RTX PRO 6000 Blackwell"     # optional GPU-model override
    gpu_count = 8                      # optional
    identity_file = "~/.ssh/id_gpu1"   # optional; else ~/.ssh/config and the agent
    known_hosts = "~/.ssh/known_hosts" # optional; else the user's known_hosts files (see below)
    insecure_skip_host_key_check = false   # true: connect WITHOUT checking the host key (never in production)
    local = false                      # true: the console runs ON the GPU host (local NVML, no SSH)
    sudo = false                       # true: systemctl and the drop-in go through `sudo -n` (no prompt)
    unit_dir = "/etc/systemd/system"   # where the unit's drop-in directory UNIT.service.d lives
    state_dir = "~/.k26-console"       # on the host: presence, the lock and audit.jsonl

The host key is always checked: against `known_hosts` when it is given, else against the user's own
files (`~/.ssh/known_hosts`, any file `UserKnownHostsFile` names in `~/.ssh/config`, and the system's
`/etc/ssh/ssh_known_hosts`). `StrictHostKeyChecking no` or `UserKnownHostsFile none` in the ssh config
do NOT turn it off; only `insecure_skip_host_key_check = true` on the host does, and then the console
says so on every screen and command.

The same file may hold an `[alerts]` table (rules, bell, the pager hook): `console/sources/alerts.py`,
and a `[ui]` table for the console's look:

    [ui]
    theme = "light"                    # dark (default), light or high-contrast; `--theme` overrides it

A name that is not in the file is taken as an ssh target with the defaults above, so
`k26-console verify gpu1` works with nothing but an `~/.ssh/config` entry.

Every problem with the file is a `HostsError` carrying one sentence for the operator.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import platformdirs
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from console.core.text import terminal_safe
from console.core.tomlread import TomlTooDeep, load_toml
from console.sources.alert_config import (
    AlertConfig,
    AlertConfigError,
    default_alert_config,
    parse_alert_config,
)

APP_NAME = "k26-console"
DEFAULT_UNIT = "sglang"
DEFAULT_SERVER_URL = "http://127.0.0.1:30000"
DEFAULT_UNIT_DIR = "/etc/systemd/system"


class HostsError(ValueError):
    """A hosts file or host name the console cannot use; `str()` is one sentence for the operator."""


class HostConfig(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str
    ssh: str = Field(validation_alias=AliasChoices("ssh", "target", "host"))
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    unit: str = DEFAULT_UNIT
    server_url: str = Field(default=DEFAULT_SERVER_URL, validation_alias=AliasChoices("server_url", "url"))
    model: str | None = None
    gpu: str | None = None
    gpu_count: int | None = Field(default=None, ge=0)
    identity_file: Path | None = None
    known_hosts: Path | None = None
    insecure_skip_host_key_check: bool = Field(default=False, strict=True)
    """Connect without checking the host key. Strict: only a TOML `true` turns the check off, never a
    string such as "yes"; the ssh config cannot turn it off at all."""
    local: bool = False
    state_dir: str = Field(default="~/.k26-console", min_length=1, pattern=r"^[^\n\r\x00]+$")
    """Where consoles on this host keep presence, the lock and audit.jsonl (on the host; "~" is the
    SSH user's home). Consoles that must exclude each other need the same directory."""
    sudo: bool = False
    """Run systemctl and the drop-in writes as `sudo -n ...`: never a password prompt, a clear refusal."""
    unit_dir: str = DEFAULT_UNIT_DIR
    """The administrator's unit directory on the host; the drop-in goes into UNIT.service.d under it."""

    @field_validator("name", "user", "unit", "model", "gpu", "state_dir")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        # These reach the terminal (titles, tabs, the header) and the host's shell scripts: a control
        # character (an escape sequence in a hand-edited file) is refused, not shown.
        if value is not None and not value.isprintable():
            raise ValueError("must hold no control characters")
        return value

    @field_validator("unit_dir")
    @classmethod
    def _unit_dir(cls, value: str) -> str:
        value = value.strip()
        if not value.startswith("/") or any(c in value for c in "\n\r\0"):
            raise ValueError("unit_dir must be an absolute path such as /etc/systemd/system")
        return value.rstrip("/") or "/"

    @field_validator("ssh")
    @classmethod
    def _target(cls, value: str) -> str:
        value = value.strip()
        if not value or any(c.isspace() for c in value):
            raise ValueError("the ssh target must be one word: an ~/.ssh/config alias, a host, or user@host")
        if value.startswith("-"):
            # would be read as an option by anything that hands it to ssh(1)
            raise ValueError("the ssh target must not start with '-'")
        return value

    @field_validator("unit")
    @classmethod
    def _unit(cls, value: str) -> str:
        value = value.strip()
        if not value or value.startswith("-") or any(c.isspace() or c == "/" for c in value):
            raise ValueError("the unit must be a systemd unit name such as 'sglang' or 'sglang.service'")
        return value

    @field_validator("server_url")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the server URL must look like http://127.0.0.1:30000")
        try:
            _ = parts.port
        except ValueError:
            raise ValueError("the server URL has a port that is not a number") from None
        return value.rstrip("/")

    @field_validator("insecure_skip_host_key_check")
    @classmethod
    def _skip_check(cls, value: bool, info: ValidationInfo) -> bool:
        # A host with its own known_hosts file and the check switched off says two opposite things;
        # neither reading is safe to guess.
        if value and info.data.get("known_hosts") is not None:
            raise ValueError(
                "cannot be true when known_hosts is set: the host key is either checked against that file "
                "or not checked at all"
            )
        return value

    @field_validator("identity_file", "known_hosts")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @property
    def ssh_host(self) -> str:
        """The host part of the target (an alias stays an alias: asyncssh resolves it from the config)."""
        return self.ssh.rpartition("@")[2]

    @property
    def ssh_user(self) -> str | None:
        user, sep, _ = self.ssh.rpartition("@")
        return self.user or (user if sep else None)

    @property
    def unit_name(self) -> str:
        """The unit with its suffix, as journald records it in `_SYSTEMD_UNIT`."""
        return self.unit if "." in self.unit else f"{self.unit}.service"

    @property
    def server_host(self) -> str:
        return urlsplit(self.server_url).hostname or "127.0.0.1"

    @property
    def server_port(self) -> int:
        parts = urlsplit(self.server_url)
        return parts.port or (443 if parts.scheme == "https" else 80)

    def describe(self) -> str:
        target = f"{self.ssh_user}@{self.ssh_host}" if self.ssh_user else self.ssh_host
        return f"{target}:{self.port}" if self.port else target


class UiConfig(BaseModel, defer_build=True):
    """The `[ui]` table. The theme's name is checked against the console's themes where they live
    (console/tui/themes.py, a layer above): here only that it is a short printable word."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    theme: str | None = Field(default=None, max_length=64)

    @field_validator("theme")
    @classmethod
    def _theme(cls, value: str | None) -> str | None:
        if value is not None and (not value.isprintable() or not value.strip()):
            raise ValueError('must be a theme\'s name such as "light"')
        return value


class HostsFile(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True)

    path: Path | None = None
    hosts: dict[str, HostConfig] = Field(default_factory=dict)
    ui: UiConfig = Field(default_factory=UiConfig)
    alerts: AlertConfig = Field(default_factory=default_alert_config)

    def get(self, name: str) -> HostConfig | None:
        return self.hosts.get(name)


def default_hosts_path() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME)) / "hosts.toml"


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = terminal_safe(".".join(str(p) for p in err["loc"]))
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "is not a known setting"
    elif err["type"] == "missing":
        message = "is missing"
    more = exc.error_count() - 1
    tail = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{where} {message}{tail}"


def parse_hosts(text: str, path: Path | None = None) -> HostsFile:
    label = str(path) if path else "the hosts file"
    try:
        data = load_toml(text)
    except tomllib.TOMLDecodeError as exc:
        raise HostsError(f"{label} is not valid TOML: {exc}.") from None
    except TomlTooDeep as exc:
        raise HostsError(f"{label} {exc}.") from None
    unknown = sorted(set(data) - {"hosts", "alerts", "ui"})
    if unknown:
        raise HostsError(f"{label} has an unknown top-level key {unknown[0]!r}; hosts go under [hosts.NAME].")
    tables = data.get("hosts", {})
    if not isinstance(tables, dict):
        raise HostsError(f"{label} must describe hosts as tables, such as [hosts.gpu1].")
    hosts: dict[str, HostConfig] = {}
    for name, table in tables.items():
        if not isinstance(table, dict):
            raise HostsError(f"{label}: hosts.{name} must be a table such as [hosts.{name}].")
        try:
            hosts[name] = HostConfig.model_validate({"name": name, **table})
        except ValidationError as exc:
            raise HostsError(f"{label}: hosts.{name}.{_first_error(exc)}.") from None
    table = data.get("ui", {})
    if not isinstance(table, dict):
        raise HostsError(f"{label}: ui must be a table such as [ui].")
    try:
        ui = UiConfig.model_validate(table)
    except ValidationError as exc:
        raise HostsError(f"{label}: ui.{_first_error(exc)}.") from None
    try:
        alerts = parse_alert_config(data.get("alerts"), path)
    except AlertConfigError as exc:
        raise HostsError(str(exc)) from None
    return HostsFile(path=path, hosts=hosts, ui=ui, alerts=alerts)


def load_hosts(path: Path | str | None = None) -> HostsFile:
    """Read the hosts file. A missing default file is an empty list; a missing `--hosts FILE` is an error."""
    explicit = path is not None
    file = Path(path).expanduser() if path is not None else default_hosts_path()
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise HostsError(f"the hosts file {file} does not exist.") from None
        return HostsFile(path=file)
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise HostsError(f"the hosts file {file} cannot be read: {reason}.") from None
    return parse_hosts(text, file)


def resolve_host(name: str, hosts: HostsFile | None = None) -> HostConfig:
    """A host by its name in the hosts file, else `name` itself as an ssh target (alias, host, user@host)."""
    hosts = hosts if hosts is not None else load_hosts()
    found = hosts.get(name)
    if found is not None:
        return found
    try:
        return HostConfig(name=name, ssh=name)
    except ValidationError as exc:
        raise HostsError(
            f"{name!r} is neither a host in the hosts file nor an ssh target: {_first_error(exc)}."
        ) from None
