"""Errors a user can cause. The CLI prints them as one line and exits with `exit_code`."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the message says what to do."""

    exit_code = 2


class InputError(UserError):
    """A missing, unreadable or malformed input file or directory."""


class RngStateError(UserError):
    """An RNG state file that cannot be loaded into this process."""
