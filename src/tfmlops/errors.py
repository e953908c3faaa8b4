"""Errors a user can fix. The CLI prints their one-line message and exits 2."""


class UserError(Exception):
    """Bad input: the message names the problem and the fix."""

    exit_code = 2


class ConfigError(UserError):
    """params.yaml (or an override) holds an unknown key, a wrong type or a bad value."""


class DataError(UserError):
    """The images, the prepared data or an upstream output is missing or unusable."""


class TrackingUnavailable(UserError):
    """The configured MLflow tracking server cannot be reached."""
