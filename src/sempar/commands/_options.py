"""Options shared by several verbs: the old spelling of a renamed option, still read; the
collective model a forecast prices with."""

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


COLLECTIVES_HELP = ("collective model (comm/collective_models.py): nccl (the papers' engines: eq. 9 "
                    "all-to-alls, rings) or gloo (sempar bench's runtime; needs a topology JSON "
                    "from `sempar profile --method all_to_all_single`); default: the topology's, "
                    "else nccl")


def collectives(name: Optional[str]) -> Optional[str]:
    """`--collectives`: a registered collective model's name, or None (the topology's)."""
    if name is not None:
        from sempar.comm.collective_models import COLLECTIVE_MODELS

        COLLECTIVE_MODELS.get(name)
    return name
