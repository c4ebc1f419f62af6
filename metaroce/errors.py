"""Errors a user can cause or fix: each carries one clear line and an exit status."""


class MetaroceError(Exception):
    """A failure reported to the user as one line, never as a traceback."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class NeedRoot(MetaroceError):
    """The operation needs root privileges (namespaces, BPF)."""

    exit_code = 2


class MissingDependency(MetaroceError):
    """A system component (package, kernel feature) is not installed."""

    exit_code = 3


class UsageError(MetaroceError):
    """Bad arguments: a clear message and exit status 2."""

    exit_code = 2
