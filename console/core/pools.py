"""Each pool of a boot against its use (issue 32 item 3): what `snapshot --json` and the KV gauge show of a
hybrid model, whose full-attention pool is not the only one that can run out.

A boot's pools come from its startup lines (`console.core.state.Pool`); their use from the newest batch
line the server printed (`Decode batch` / `Prefill batch`: `#token`, `token usage`, `#swa token`,
`swa token usage`, `mamba num`, `mamba usage`). A figure the lines do not give is None, never 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from console.core.events import DecodeBatch, Event, PrefillBatch
from console.core.state import Boot


class PoolReading(BaseModel, defer_build=True):
    """One pool, per GPU: its size, what it costs, and how much of it the newest batch line used."""

    model_config = ConfigDict(frozen=True)

    pool: Literal["full", "swa", "mamba", "draft", "dsv4_c4", "dsv4_c128"]
    size: int | None = None
    unit: Literal["tokens", "slots"] = "tokens"
    gib: float | None = None
    used: int | None = None
    usage: float | None = None
    """Used over size, as SGLang printed it (0 to 1)."""


def latest_batch(events: Iterable[Event]) -> DecodeBatch | PrefillBatch | None:
    """The newest batch statistics line among `events` (oldest first)."""
    found: DecodeBatch | PrefillBatch | None = None
    for event in events:
        if isinstance(event, DecodeBatch | PrefillBatch):
            found = event
    return found


def pool_readings(boot: Boot | None, recent: Iterable[Event] = ()) -> list[PoolReading]:
    """Every pool the boot showed, the full (context) pool first; empty without a sized boot."""
    if boot is None or boot.pool.tokens is None:
        return []
    pool = boot.pool
    batch = latest_batch(recent)
    decode = batch if isinstance(batch, DecodeBatch) else None
    sliding = pool.swa_tokens is not None
    full_usage = None
    if batch is not None:
        full_usage = batch.full_token_usage if batch.full_token_usage is not None else batch.token_usage
    out = [
        PoolReading(
            pool="full",
            size=pool.tokens,
            # The first KV line of a sliding-window model is its SWA pool: its GiB would mislead.
            gib=None if sliding else pool.kv_gb,
            used=decode.num_tokens if decode is not None else None,
            usage=full_usage,
        )
    ]
    if sliding:
        out.append(
            PoolReading(
                pool="swa",
                size=pool.swa_tokens,
                used=decode.swa_tokens if decode is not None else None,
                usage=batch.swa_token_usage if batch is not None else None,
            )
        )
    if pool.mamba_slots is not None:
        out.append(
            PoolReading(
                pool="mamba",
                size=pool.mamba_slots,
                unit="slots",
                gib=pool.mamba_gb,
                used=decode.mamba_num if decode is not None else None,
                usage=batch.mamba_usage if batch is not None else None,
            )
        )
    if pool.draft_kv_tokens is not None:
        out.append(PoolReading(pool="draft", size=pool.draft_kv_tokens, gib=pool.draft_kv_gb))
    if pool.dsv4_c4_tokens is not None:
        out.append(PoolReading(pool="dsv4_c4", size=pool.dsv4_c4_tokens))
    if pool.dsv4_c128_tokens is not None:
        out.append(PoolReading(pool="dsv4_c128", size=pool.dsv4_c128_tokens))
    return out
