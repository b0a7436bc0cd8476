"""What a check found, in one shape for every check the console makes of flags and profiles (the flag
check against SGLang's parser, the profile check, the editor's live check): where, how bad, a code a test
or a script can match, and one sentence for the operator."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Issue(BaseModel, defer_build=True):
    model_config = ConfigDict(frozen=True)

    where: str
    """`flags.<key>`, `command`, `target_context`, `line 12`, or the flag as written for the flag check."""
    level: Literal["error", "warning"]
    code: str = ""
    message: str
    """One sentence that names what it is about."""


class Findings(BaseModel, defer_build=True):
    """A check's issues; `ok` when none is an error."""

    issues: list[Issue] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.level == "error"]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.level == "warning"]
