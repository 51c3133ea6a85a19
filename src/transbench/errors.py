"""Errors that reach the user as one line (the CLI prints them and exits 2)."""


class SpecError(ValueError):
    """Bad input: the message names the problem and the fix."""


class Unsupported(RuntimeError):
    """A backend, dtype or task that cannot run here; the message says why and what to install."""
