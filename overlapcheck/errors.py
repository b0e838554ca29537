"""The one exception type for problems the user can cause (bad input, bad options)."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input. The CLI prints it as one line on stderr and exits with code 2."""

    def __init__(self, message: str, path: str | None = None):
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)
