"""Errors that carry a one-line message for the user.

`InputError` is raised for anything the user gave us that is wrong (a file, an option, a
value); the CLI prints its message on one line and exits with code 2. Anything else is a bug
or an environment failure and exits with code 1.
"""


class InputError(ValueError):
    """Bad input: the message names what is wrong (field, row, value) in one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def check_choice(option: str, value: object, choices: "tuple | list") -> None:
    """Bad input unless `value` is one of `choices`: "OPTION: 'x' is not one of a, b"."""
    if value not in choices:
        raise InputError(f"{option}: {value!r} is not one of {', '.join(map(str, choices))}")
