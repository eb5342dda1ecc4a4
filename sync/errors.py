"""The one exception type the command line turns into a one-line message and exit code.

Every package raises a subclass with a sentence a user can act on; anything else that
escapes is a bug and keeps its traceback.
"""


class LakesyncError(Exception):
    """An expected failure with a message meant for the user."""

    exit_code = 2


class ServiceUnavailable(LakesyncError):
    """A component (Postgres, Kafka, Connect, the runner) cannot be reached."""


class StackError(LakesyncError):
    """The embedded stack cannot start or stop (port in use, missing Java, ...)."""


class NotFresh(LakesyncError):
    """The freshness barrier timed out; the message names what is behind."""

    exit_code = 1


class Fenced(LakesyncError):
    """A newer run of the same projection holds a higher epoch: this writer must stop."""

    exit_code = 3


class RunnerFailed(LakesyncError):
    """The runner could not start, or one of its queries failed."""

    exit_code = 1
