"""Options shared by several verbs, each declared and bounded here once: `--seed`, `--ep`,
`--nodes`, `--json`; the old spelling of a renamed option, still read; the collective model a
forecast prices with."""

from __future__ import annotations

from typing import Any, Optional, TypeVar

import typer

from sempar.bounds import DEVICES, DEVICES_MAX, HOSTS, SEED, bound, check_bound
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


def seed_option(help: Optional[str] = None) -> Any:
    """`--seed`: an integer in 0..SEED_MAX, default 0."""
    return typer.Option(0, "--seed", help=help, callback=SEED)


def optional_seed_option(help: Optional[str] = None) -> Any:
    """`--seed` with no default (None: the verb passes no seed on), bounded as `seed_option`."""
    return typer.Option(None, "--seed", help=help, callback=SEED)


def ep_option(default: Any, help: str, *, live: bool = False, also: tuple[str, ...] = ()) -> Any:
    """`--ep` (and the spellings in `also`): the EP degree G, 1..DEVICES_MAX; with `live` (one
    real process per rank) 2..HOSTS_MAX. `default` ... makes it required."""
    return typer.Option(default, "--ep", *also, help=help, callback=HOSTS if live else DEVICES)


def ep_values(text: Optional[str]) -> list[Optional[int]]:
    """A comma-separated `--ep` list as EP degrees, each bounded as `ep_option`'s; [None] (the
    topology's devices) when not given."""
    if not text:
        return [None]
    from sempar.serving.setup import parse_floats

    return [check_bound("--ep", int(x), 1, DEVICES_MAX) for x in parse_floats(text, "--ep") or []]


def ep_list_option(help: str) -> Any:
    """`--ep` as a comma-separated list of EP degrees (read with `ep_values`), checked on parsing."""
    def check(value: Optional[str]) -> Optional[str]:
        ep_values(value)
        return value

    return typer.Option(None, "--ep", help=help, callback=check)


def nodes_option(default: Any, help: Optional[str] = None) -> Any:
    """`--nodes`: nodes the devices are grouped into, 1..DEVICES_MAX (a node holds a device)."""
    return typer.Option(default, "--nodes", help=help, callback=DEVICES)


def json_option(help: str = "print one JSON object") -> Any:
    """`--json`: one JSON object on stdout and nothing else there (`console.emit_json`)."""
    return typer.Option(False, "--json", help=help)


def objective_option() -> Any:
    """`--objective`: the items `sempar` solves on (placement/sempar/rows.py)."""
    return typer.Option("auto", "--objective",
                        help="sempar's items: tokens (token ids: homes from a token table), rows "
                             "(fit rows: homes from exact pre-routing), auto (rows without token "
                             "ids)")


def held_out_option() -> Any:
    """`--held-out-imbalance`: the imbalance on new requests sempar's rows objective aims at."""
    return typer.Option(1.10, "--held-out-imbalance", callback=bound(1.0, 100.0),
                        help="rows objective: the imbalance on new requests to stay within (the "
                             "fit cap is lowered while a request bootstrap predicts more)")
