"""The one exception type ats-data raises for bad input (missing or malformed sources, shards,
indexes, loader arguments). The CLI turns it into a one-line message and a non-zero exit."""


class DataError(ValueError):
    """Bad data input; the message names the file, field or value and what was expected."""
