"""Options shared by several verbs: the old spelling of a renamed option, still read."""

from __future__ import annotations

from typing import Optional, TypeVar

from sempar.errors import InputError

T = TypeVar("T")


def renamed(value: Optional[T], old_value: Optional[T], name: str, old: str,
            default: Optional[T] = None) -> T:
    """The value of option `name`, or of its hidden old spelling `old` when only that was given.

    Both given is a usage error; neither gives `default` (None: the option is required)."""
    if value is not None and old_value is not None:
        raise InputError(f"{old}: the old spelling of {name}; give one of them")
    chosen = value if value is not None else old_value
    if chosen is None:
        if default is None:
            raise InputError(f"missing option '{name}'")
        return default
    return chosen
