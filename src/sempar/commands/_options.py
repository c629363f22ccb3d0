"""Options shared by several verbs, each declared and bounded here once: `--seed`, `--ep`,
`--nodes`, `--json`, the user's options of a placement solve (`--mode`, `--max-imbalance`,
`--redundant`, ..., gathered into one `SolveOptions` by `solve_options`), the serving forecast's workload (`--rates`, `--duration`, `--input-len`,
`--output-len`, `--token-budget`, `--max-running`, `--slo`, `--slo-scale`); name lists checked
against their registry (`_names.names_option`); options that apply to some pipelines only (`given`,
`refuse_unused`); the old spelling of a renamed option, still read; the collective model a
forecast prices with."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable, Optional, TypeVar

import typer

from sempar.bounds import (BUDGET_MAX, DEVICES, DEVICES_MAX, HOSTS, RATE_MAX, REDUNDANT_MAX,
                           REQUEST_TOKENS_MAX, RUNNING_MAX, SCALE_MAX, SECONDS_MAX, SEED, Bounds,
                           NumberList, bound)
from sempar.errors import InputError
from sempar.commands._names import names_option
from sempar.solve_options import DEFAULT_HOMES, HOME_RULES, SolveOptions

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
                    "all-to-alls, rings), nccl-links (nccl plus links shared by the pairs) or "
                    "gloo (sempar bench's runtime; needs a topology JSON from `sempar profile "
                    "--method all_to_all_single`); default: the topology's, else nccl "
                    "(simulate) / nccl-links for a preset topology (serve-sim, plan)")


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


EP_LIST = NumberList("--ep", Bounds(1, DEVICES_MAX, integer=True))


def ep_values(text: Optional[str]) -> list[Optional[int]]:
    """A comma-separated `--ep` list as EP degrees, each bounded as `ep_option`'s; [None] (the
    topology's devices) when not given."""
    return EP_LIST.parse(text) if text else [None]


def ep_list_option(help: str) -> Any:
    """`--ep` as a comma-separated list of EP degrees (read with `ep_values`), checked on parsing;
    `8.9` is refused, not truncated."""
    return typer.Option(None, "--ep", help=help, callback=EP_LIST.callback)


def nodes_option(default: Any, help: Optional[str] = None) -> Any:
    """`--nodes`: nodes the devices are grouped into, 1..DEVICES_MAX (a node holds a device)."""
    return typer.Option(default, "--nodes", help=help, callback=DEVICES)


def json_option(help: str = "print one JSON object") -> Any:
    """`--json`: one JSON object on stdout and nothing else there (`console.emit_json`)."""
    return typer.Option(False, "--json", help=help)


# ---- the user's options of a placement solve (place, evaluate): SolveOptions' fields -----

SOLVE = SolveOptions()      # the defaults: each declared once, in sempar/solve_options.py
# (--homes: DEFAULT_HOMES there, the deployment the command line assumes unless told)


def mode_option(help: str = "mode the placement serves: dp or tp") -> Any:
    """`--mode`: the attention mode the placement serves (SolveOptions.mode)."""
    return typer.Option(SOLVE.mode, "--mode", help=help)


def redundant_option(help: str = "replica slots per layer") -> Any:
    """`--redundant`: replica slots per layer, 0..REDUNDANT_MAX (SolveOptions.redundant)."""
    return typer.Option(SOLVE.redundant, "--redundant", help=help,
                        callback=bound(0, REDUNDANT_MAX))


def max_imbalance_option() -> Any:
    """`--max-imbalance`: the per-layer device load cap, x the mean, in [1, 100]."""
    return typer.Option(SOLVE.max_imbalance, "--max-imbalance",
                        help="per-layer device load cap, x the mean", callback=bound(1.0, 100.0))


def preserve_groups_option() -> Any:
    """`--preserve-groups`: experts stay in their expert group's slots."""
    return typer.Option(SOLVE.preserve_groups, "--preserve-groups",
                        help="experts stay in their expert group's slots")


def home_rules() -> Any:
    """The home rules' registry (sempar/solve_options.py)."""
    return HOME_RULES


def homes_option() -> Any:
    """`--homes`: how the deployment will choose each token's home (SolveOptions.homes); the
    help lists the registered rules with the objective each gets."""
    rules = ", ".join(f"{n} ({HOME_RULES.get(n).objective})" for n in HOME_RULES.names())
    return names_option(DEFAULT_HOMES, "--homes", home_rules, single=True,
                        help=f"how the deployment homes tokens, which --objective auto follows: "
                             f"{rules}; default {DEFAULT_HOMES}: sglang-ep's, the pipeline "
                             f"`sempar plan` recommends most often")


def objective_option() -> Any:
    """`--objective`: the items `sempar` solves on (placement/sempar/rows.py)."""
    return typer.Option(SOLVE.objective, "--objective",
                        help="sempar's items: tokens (token ids: homes from a token table), rows "
                             "(fit rows: exact or position homes), auto (the --homes rule's; "
                             "rows without token ids)")


def held_out_option() -> Any:
    """`--held-out-imbalance`: the imbalance on new requests sempar's rows objective aims at."""
    return typer.Option(SOLVE.held_out_imbalance, "--held-out-imbalance",
                        callback=bound(1.0, 100.0),
                        help="rows objective: the imbalance on new requests to stay within (the "
                             "fit cap is lowered while a request bootstrap predicts more)")


def jobs_option() -> Any:
    """`--jobs`: worker processes for per-layer solver work, 1..4096 (None: usable CPUs)."""
    return typer.Option(SOLVE.jobs, "--jobs", callback=bound(1, 4096),
                        help="worker processes (default: usable CPUs)")


def effort_option() -> Any:
    """`--effort`: x sempar's work budget (rows objective: fit rows solved and restarts)."""
    return typer.Option(SOLVE.effort, "--effort", callback=bound(0.0, 1000.0, lo_open=True),
                        help="x sempar's work budget: on large models the rows objective "
                             "solves a sample of the fit rows and fewer restarts sized to "
                             "it (about a minute at DeepSeek-V3 shape); more buys both back, "
                             "and from 2 a hypergraph-partition start (sempar-hypergraph's)")


def solve_options(ctx: typer.Context, **over: Any) -> SolveOptions:
    """The verb's `SolveOptions`, built once from its command line: every parameter of the verb
    named as a SolveOptions field (`--nodes` as num_nodes), then `over`; the fields a verb does
    not offer keep their defaults. Passed whole from here to every solve."""
    names = {f.name for f in fields(SolveOptions)}
    given = {("num_nodes" if k == "nodes" else k): v for k, v in ctx.params.items()}
    return SolveOptions(**{k: v for k, v in {**given, **over}.items() if k in names})


# ---- the serving forecast's workload (serve-sim, plan) -------------------------------------

RATES = NumberList("--rates", Bounds(0, RATE_MAX, lo_open=True))


def rates_option(help: str) -> Any:
    """`--rates`: requests/s, comma-separated (read with `RATES.parse`); rate x `--duration` is
    bounded by `bounds.check_requests` once the rates are known."""
    return typer.Option(None, "--rates", help=help, callback=RATES.callback)


def duration_option(default: float) -> Any:
    """`--duration`: seconds of arrivals per rate, (0, SECONDS_MAX]."""
    return typer.Option(default, "--duration", help="seconds of arrivals per rate (rate x "
                        "duration: at most bounds.REQUESTS_MAX requests)",
                        callback=bound(0, SECONDS_MAX, lo_open=True))


def input_len_option() -> Any:
    """`--input-len`: prompt tokens per request, 1..REQUEST_TOKENS_MAX."""
    return typer.Option(512, "--input-len", help="prompt tokens per request",
                        callback=bound(1, REQUEST_TOKENS_MAX))


def output_len_option() -> Any:
    """`--output-len`: generated tokens per request, 1..REQUEST_TOKENS_MAX."""
    return typer.Option(128, "--output-len", help="generated tokens per request",
                        callback=bound(1, REQUEST_TOKENS_MAX))


def budget_option() -> Any:
    """`--token-budget`: tokens per iteration per device, 1..BUDGET_MAX."""
    return typer.Option(2048, "--token-budget", help="tokens per iteration per device",
                        callback=bound(1, BUDGET_MAX))


def max_running_option() -> Any:
    """`--max-running`: requests in flight per device, 1..RUNNING_MAX."""
    return typer.Option(128, "--max-running", help="running requests per device",
                        callback=bound(1, RUNNING_MAX))


def slo_scale_option() -> Any:
    """`--slo-scale`: SLO = this x the lightest-load latency, (0, SCALE_MAX]."""
    return typer.Option(5.0, "--slo-scale", help="SLO = this x the lightest-load latency",
                        callback=bound(0, SCALE_MAX, lo_open=True))


def slo_option(help: str) -> Any:
    """`--slo KEY=SECONDS,...` (serving.setup.parse_slo: each finite, in (0, SECONDS_MAX])."""
    def check(value: Optional[str]) -> Optional[str]:
        from sempar.serving.setup import parse_slo

        parse_slo(value)
        return value

    return typer.Option(None, "--slo", help=help, callback=check)


# ---- options that apply to some choices only ----------------------------------------------

def given(ctx: typer.Context, name: str) -> bool:
    """Whether the parameter `name` (its Python name) was given on the command line."""
    src = ctx.get_parameter_source(name)
    return src is not None and src.name == "COMMANDLINE"


def refuse_unused(ctx: typer.Context, knobs: dict[str, str], takes: Callable[[str], bool],
                  chosen: str) -> None:
    """Refuse an option given on the command line that none of the choices takes.

    knobs: {python parameter name: knob name in the registry}; takes(knob): whether any chosen
    item (pipeline, strategy) declares it; chosen: the choices as the user named them."""
    for param, knob in knobs.items():
        if given(ctx, param) and not takes(knob):
            opt = next(("/".join([max(p.opts, key=len), *p.secondary_opts])
                        for p in ctx.command.params if p.name == param), param)
            raise InputError(f"{opt}: does not apply to {chosen}")


def accelerator_profile_option() -> Any:
    return typer.Option(None, "--accelerator-profile", help="an accelerator profile (JSON, "
                        "`sempar calibrate`) pricing compute; default: the one shipped for "
                        "--accelerator (h100), else roofline + fixed per-kernel cost")
