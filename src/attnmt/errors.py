"""The errors attnmt raises for user mistakes; the CLI prints them as one line, no traceback."""


class AttnmtError(Exception):
    """Base class for errors caused by input, configuration or files, not by a bug."""


class ConfigError(AttnmtError):
    """An invalid or unreadable configuration."""


class DataError(AttnmtError):
    """Unreadable or inconsistent corpus files (names the file and line)."""


class CheckpointError(AttnmtError):
    """A missing, incomplete or incompatible model or checkpoint directory."""
