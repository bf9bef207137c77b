"""The one exception type users see: a message that says what is wrong and how to fix it."""


class BiodistilError(Exception):
    """A user-facing error (bad recipe, bad file, unreachable model). The CLI prints it without a traceback."""
