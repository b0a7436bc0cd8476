"""The probe's history on this machine (one JSON line per depth measured, under the state dir), and the
figures a probe leaves in the profile it measured.
"""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import ValidationError

from console.core.probe import (
    ProbeReport,
)
from console.core.probe_history import ProbeRecord, records_of, tok_s_by_depth
from console.core.profiles import Verified
from console.sources.hosts import APP_NAME
from console.sources.profile_store import ProfileStore


def default_history_path() -> Path:
    return Path(platformdirs.user_state_dir(APP_NAME)) / "probes.jsonl"


def append_history(report: ProbeReport, path: Path | None = None) -> Path:
    """Append one line per depth of `report`; one write per run, so two consoles do not interleave."""
    path = path or default_history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(rec.model_dump_json() + "\n" for rec in records_of(report))
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text)
    return path


def load_history(path: Path | None = None, *, host: str | None = None) -> list[ProbeRecord]:
    """The records kept so far (those of `host` only when given); unreadable lines are skipped."""
    path = path or default_history_path()
    try:
        # One record a line, split on "\n" only: a record's text may hold U+2028 or \x85 (JSON leaves
        # them raw), where str.splitlines would cut it in two and lose it.
        lines = path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError):
        return []
    records: list[ProbeRecord] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = ProbeRecord.model_validate_json(line)
        except ValidationError:
            continue
        if host is None or rec.host == host:
            records.append(rec)
    return records


def record_profile(report: ProbeReport, profile: str, store: ProfileStore | None = None) -> Path | None:
    """Keep the run's tok/s by depth in the profile's `[verified]` section; None when nothing measured."""
    depths = tok_s_by_depth(report)
    if not depths:
        return None
    store = store or ProfileStore()
    return store.record_verified(profile, Verified(tok_s_at_depth=depths))
