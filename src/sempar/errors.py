"""Errors that carry a one-line message for the user.

`InputError` is raised for anything the user gave us that is wrong (a file, an option, a
value); the CLI prints its message on one line and exits with code 2. Anything else is a bug
or an environment failure and exits with code 1.
"""


class InputError(ValueError):
    """Bad input: the message names what is wrong (field, row, value) in one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
