"""Exit codes and user-facing errors, the same for every gputune command.

The exit code is an interface (scripts and CI branch on it), so it is defined
once here and documented in the README:

- 0 OK: all is well (doctor: no failing check; triage: a cause was found).
- 1 BAD_ANSWER: the command worked and the answer is bad (a check failed, a
  plan was refused, a launched server died, a tunable could not be set,
  triage found no cause).
- 2 USAGE: the command line or its inputs are wrong.
- 3 INTERNAL: gputune itself broke.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    BAD_ANSWER = 1
    USAGE = 2
    INTERNAL = 3


class GputuneError(Exception):
    """An error meant for a person: one line saying what, one saying how to fix it."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(GputuneError):
    """Bad command line or bad input file (missing, unreadable, wrong format)."""

    exit_code = ExitCode.USAGE


class BadAnswer(GputuneError):
    """The command ran and the answer is bad (refused plan, dead server, ...)."""

    exit_code = ExitCode.BAD_ANSWER
