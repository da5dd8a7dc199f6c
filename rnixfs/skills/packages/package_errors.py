"""Package errors: one readable line each, and a distinct exit code per kind.

The exit codes are part of the CLI contract (docs/packages.md):
1 other error, 2 usage, 3 not found, 4 verification failed, 5 network
error, 6 already installed, 7 unsafe archive, 8 confirmation required.
"""
from __future__ import annotations

from ..model import SkillError


class PackageError(SkillError):
    """A package operation failed; ``str()`` names the source and what to do."""

    code = "ERROR"
    exit_code = 1


class UsageError(PackageError):
    code, exit_code = "USAGE", 2


class SeveralSkills(UsageError):
    """A source holds several skills and none was named; ``names`` lists them."""

    def __init__(self, message: str, names: list[str]):
        super().__init__(message)
        self.names = names


class NotFound(PackageError):
    code, exit_code = "NOT_FOUND", 3


class VerificationFailed(PackageError):
    code, exit_code = "VERIFICATION_FAILED", 4


class NetworkError(PackageError):
    code, exit_code = "NETWORK_ERROR", 5


class AlreadyInstalled(PackageError):
    code, exit_code = "ALREADY_INSTALLED", 6


class UnsafeArchive(PackageError):
    code, exit_code = "UNSAFE_ARCHIVE", 7


class ConfirmationRequired(PackageError):
    code, exit_code = "CONFIRMATION_REQUIRED", 8
