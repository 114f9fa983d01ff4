"""User-facing errors: each carries one clear line, and optionally what to do about it."""

from __future__ import annotations


class SpecdeckError(Exception):
    """An error the CLI prints as one line (plus an optional hint) and exits non-zero on."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class CatalogError(SpecdeckError):
    """models.toml is missing, malformed, or names something it does not define."""


class GGUFError(SpecdeckError):
    """A file is not a readable GGUF model."""


class IntegrityError(SpecdeckError):
    """A file's size or SHA-256 differs from what was expected."""


class SourceUnavailable(SpecdeckError):
    """A download source could not be reached (offline, DNS, connection refused): try the next one."""


class DownloadError(SpecdeckError):
    """A download failed in a way that trying another source will not fix for this source."""


class DiskSpaceError(SpecdeckError):
    """Not enough free disk space for a download."""


class PairError(SpecdeckError):
    """The draft model cannot serve the target."""

    exit_code = 2
