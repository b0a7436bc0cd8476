"""The one way a test module gets its twin: `twin = module_twin("name", **TwinHost options)` at module level
gives the module a module-scoped `twin` fixture, started once for the module (in one xdist worker: the
module is one work unit) and stopped after its last test, however that test ended."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from console.twin.host import TwinHost
from tests.support.cli import started_twin


def module_twin(prefix: str, **options: Any) -> Callable[..., Iterator[TwinHost]]:
    """A module-scoped fixture yielding a started `TwinHost(<tmp>/<prefix>N/state, **options)`."""

    @pytest.fixture(scope="module")
    def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwinHost]:
        with started_twin(tmp_path_factory.mktemp(prefix) / "state", **options) as host:
            yield host

    return twin
