"""Errors a user can act on. The CLI prints them as one line each and exits with their code."""

from __future__ import annotations

__all__ = ["TunekitError", "ConfigError", "UsageError", "StorageError"]


class TunekitError(Exception):
    """A failure the user can understand without a traceback. Exit code 1 (runtime failure)."""

    exit_code = 1

    def lines(self) -> list[str]:
        return [str(self)]


class StorageError(TunekitError):
    """The run's study cannot be read or written: its study.db (disk full, read-only folder, corrupt file) or the
    database its URL names (a server that cannot be reached, or refuses). Exit code 1; the trials already recorded
    stay where they are."""


class UsageError(TunekitError):
    """Bad command-line usage. Exit code 2."""

    exit_code = 2


class ConfigError(TunekitError):
    """One or more problems in a config file, all reported at once. Exit code 2.

    Args:
        problems: one message per problem, each already naming the file and key path.
    """

    exit_code = 2

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = list(problems)

    def lines(self) -> list[str]:
        return self.problems
