"""The errors attnmt raises for user mistakes; the CLI prints them as one line, no traceback."""


class AttnmtError(Exception):
    """Base class for errors caused by input, configuration or files, not by a bug."""


class ConfigError(AttnmtError):
    """An invalid or unreadable configuration."""


class DataError(AttnmtError):
    """Unreadable or inconsistent corpus files (names the file and line)."""


class CheckpointError(AttnmtError):
    """A missing, incomplete or incompatible model or checkpoint directory."""


class WriteError(AttnmtError):
    """A file cannot be written (full disk, no permission, missing directory); names the file."""


class TrainingError(AttnmtError):
    """Training cannot go on (e.g. too many non-finite updates in a row); the run is resumable."""
