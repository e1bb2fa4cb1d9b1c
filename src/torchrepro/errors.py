"""Errors a user can cause. The CLI prints them as one line and exits with `exit_code`."""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the message says what to do."""

    exit_code = 2


class InputError(UserError):
    """A missing, unreadable or malformed input file or directory."""


class ScriptFailed(UserError):
    """The user's script failed where a command needs it to end normally (``golden record``)."""

    exit_code = 3


class RngStateError(UserError):
    """An RNG state file that cannot be loaded into this process."""


class NotStarted(UserError):
    """``--timeout`` ran out before any rank of the job started: the script never ran under
    observation, and did not fail (exit 3: the job did not end normally)."""

    exit_code = 3

    def __init__(self, timeout: float, what: str = ""):
        super().__init__(
            f"{what}no rank started within {timeout:g} s: --timeout {timeout:g} ended the job while it was starting "
            "(the launcher, the interpreter and its imports), before the script ran under capture; nothing was "
            "judged. Give a --timeout longer than the start-up (it counts seconds without progress, from the launch)"
        )
        self.timeout = timeout


def stop_exit_code(signal_name: str) -> int:
    """The exit code for a job stopped by ``signal_name``: 128 + its number, as a shell reports it."""
    import signal

    return 128 + signal.Signals[signal_name].value


class Stopped(UserError):
    """A signal sent to torchrepro (SIGINT, SIGTERM, SIGHUP) stopped the job."""

    def __init__(self, message: str, signal_name: str):
        super().__init__(message)
        self.signal_name = signal_name
        self.exit_code = stop_exit_code(signal_name)
