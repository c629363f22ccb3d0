"""Name -> object registries, so the CLI, the reports and the benchmarks list the same set.

Every solver, scheduler, pipeline, strategy and synthetic preset is registered once here::

    PRESETS = Registry("preset")

    @PRESETS.register("mixtral-8x7b")
    def _mixtral(): ...
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from sempar.errors import InputError

T = TypeVar("T")


class Registry(Generic[T]):
    """An ordered mapping name -> item; unknown names raise `InputError` listing the known ones."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._items[name] = item
        return item

    def register(self, name: str) -> Callable[[T], T]:
        def deco(item: T) -> T:
            return self.add(name, item)

        return deco

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(self._items)
            raise InputError(f"unknown {self.kind} {name!r}; choose one of: {known}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
