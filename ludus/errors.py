"""The one error type the CLI turns into a one-line message and a non-zero exit.

Every module raises a subclass of `UserError` for bad input (config, checkpoint, game id,
submission, run directory); anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input from a user; the message names the problem and says what to do."""
