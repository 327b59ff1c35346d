"""The command line's own refusal: one line on stderr, exit 1."""

from __future__ import annotations

__all__ = ["CliError"]


class CliError(Exception):
    """A refusal the command line reports in one line (exit 1)."""
