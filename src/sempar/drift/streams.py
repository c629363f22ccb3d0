"""Drift streams: a trace's real requests reordered so that the traffic mix changes over time.

A stream is a `RoutingTrace` whose requests, in row order, are the arrival order `sempar replay`
serves. Every request keeps its recorded routing; only the order (and, for `groups`, the domain
labels) change. Orders (`ORDERS`, registered once):

- `tasks`: every domain's requests one domain after another (DeepSeek-V2-Lite ESFT: intent, then
  law, then summary), each domain's requests in trace order;
- `groups`: the domains mapped to coarser groups first (`GROUPS`: MMLU's four subject groups,
  STEM / humanities / social sciences / other, for GPT-OSS-20B's 70 MMLU and MMLU-Pro subjects;
  applied only when every domain is in the table), then the groups one after another; the stream's
  domain column names the group;
- `mixture`: segments of `switch_every` requests; segment s draws a share `mix` of its requests
  from domain (group, when the domains are MMLU subjects) s mod D and the rest evenly from the
  others (seeded), until the requests run out: the mix switches every K requests.

Request ids are renumbered 0..R-1 in stream order, so "request r" means the r-th arrival.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from sempar.errors import InputError
from sempar.registry import Registry
from sempar.trace.schema import RoutingTrace

# MMLU's subject -> group table (Hendrycks et al., the four categories of the MMLU paper's
# results), and MMLU-Pro's 14 categories mapped likewise.
_STEM = ("abstract_algebra anatomy astronomy college_biology college_chemistry "
         "college_computer_science college_mathematics college_physics computer_security "
         "conceptual_physics electrical_engineering elementary_mathematics high_school_biology "
         "high_school_chemistry high_school_computer_science high_school_mathematics "
         "high_school_physics high_school_statistics machine_learning "
         "biology chemistry computer_science engineering math physics")
_HUMANITIES = ("formal_logic high_school_european_history high_school_us_history "
               "high_school_world_history international_law jurisprudence logical_fallacies "
               "moral_disputes moral_scenarios philosophy prehistory professional_law "
               "world_religions history law")
_SOCIAL = ("econometrics high_school_geography high_school_government_and_politics "
           "high_school_macroeconomics high_school_microeconomics high_school_psychology "
           "human_sexuality professional_psychology public_relations security_studies sociology "
           "us_foreign_policy economics psychology")
_OTHER = ("business_ethics clinical_knowledge college_medicine global_facts human_aging "
          "management marketing medical_genetics miscellaneous nutrition professional_accounting "
          "professional_medicine virology business health other")
GROUPS: dict[str, str] = {name: group for group, names in (
    ("stem", _STEM), ("humanities", _HUMANITIES), ("social", _SOCIAL), ("other", _OTHER))
    for name in names.split()}


def group_of(domain: str) -> str:
    """MMLU group of a subject name (spaces read as underscores), else the name itself."""
    return GROUPS.get(domain.replace(" ", "_"), domain)


def request_table(trace: RoutingTrace
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(request id int64[R] in arrival order, domain code int64[R] of each (its first row's;
    -1 unknown), rows int64[T] of the trace grouped by request in that order, row offsets
    int64[R + 1] of each request in `rows`)."""
    if trace.num_tokens == 0:
        raise InputError("--trace: the trace holds no tokens")
    reqs, first, inv, cnt = np.unique(trace.request_id, return_index=True, return_inverse=True,
                                      return_counts=True)
    arrival = np.argsort(first, kind="stable")
    dom = (np.full(reqs.size, -1, np.int64) if trace.domain is None
           else trace.domain[first].astype(np.int64))
    rank = np.empty(reqs.size, np.int64)
    rank[arrival] = np.arange(reqs.size)
    rows = np.argsort(rank[inv.reshape(-1)], kind="stable")
    starts = np.concatenate([[0], np.cumsum(cnt[arrival])]).astype(np.int64)
    return reqs[arrival], dom[arrival], rows, starts


def _labels(trace: RoutingTrace, dom: np.ndarray, grouped: bool) -> tuple[np.ndarray, list[str]]:
    """(label int64[R], names): each request's domain or MMLU group, named."""
    if trace.domain is None or (dom < 0).all():
        raise InputError("--trace: no request carries a domain (import it with its "
                         "request_domain / request_category array)")
    names = [group_of(d) if grouped else d for d in trace.domains] + ["unknown"]
    uniq = sorted(set(names[d] for d in dom))
    code = np.array([uniq.index(names[d]) for d in dom], np.int64)
    return code, uniq


@dataclass(frozen=True)
class Order:
    """A stream order: (labels int64[R], label count, switch_every, mix, rng) -> request
    positions int64[R] in stream order; grouped: labels are MMLU groups."""

    fn: Callable[..., np.ndarray]
    grouped: bool
    help: str


ORDERS: Registry[Order] = Registry("stream order")


def _sequential(label: np.ndarray, n: int, switch_every: int, mix: float, rng) -> np.ndarray:
    return np.argsort(label, kind="stable")


def _mixture(label: np.ndarray, n: int, switch_every: int, mix: float, rng) -> np.ndarray:
    pools = [list(rng.permutation(np.flatnonzero(label == c))) for c in range(n)]
    out: list[int] = []
    seg = 0
    while any(pools):
        main = seg % n
        for i in range(switch_every):
            others = [c for c in range(n) if c != main and pools[c]]
            if pools[main] and (not others or rng.random() < mix):
                out.append(pools[main].pop())
            elif others:
                out.append(pools[others[int(rng.integers(len(others)))]].pop())
            else:
                break
        seg += 1
    return np.asarray(out, np.int64)


ORDERS.add("tasks", Order(_sequential, False, "each domain's requests, one domain after another"))
ORDERS.add("groups", Order(_sequential, True, "MMLU subject groups one after another"))
ORDERS.add("mixture", Order(_mixture, True, "segments of K requests, each mostly one domain "
                                            "(MMLU group)"))


def drift_stream(trace: RoutingTrace, order: str = "tasks", switch_every: int = 16,
                 mix: float = 0.8, seed: int = 0) -> RoutingTrace:
    """The stream (module docstring) of `trace` by `order`; `switch_every` and `mix` are read by
    `mixture`. Its request ids are 0..R-1 in arrival order; with `groups` (and `mixture` on
    MMLU subjects) the domain column names the group."""
    spec = ORDERS.get(order)
    if switch_every < 1 or not 0.0 <= mix <= 1.0:
        raise InputError(f"--switch-every {switch_every} / --mix {mix}: need K >= 1, mix in [0, 1]")
    reqs, dom, rows, starts = request_table(trace)
    grouped = spec.grouped and all(d.replace(" ", "_") in GROUPS for d in trace.domains)
    label, names = _labels(trace, dom, grouped)
    pos = spec.fn(label, len(names), switch_every, mix, np.random.default_rng(seed))
    take = np.concatenate([rows[starts[p]:starts[p + 1]] for p in pos])
    out = trace.take(take)
    sizes = (starts[1:] - starts[:-1])[pos]
    out.request_id = np.repeat(np.arange(pos.size, dtype=np.int32), sizes)
    if grouped:
        out.domains = list(names)
        out.domain = np.repeat(label[pos].astype(np.int16), sizes)
    return out


def phases(trace: RoutingTrace) -> list[tuple[int, str]]:
    """[(first request, domain name)]: where the stream's domain changes, in arrival order."""
    _, dom, _, _ = request_table(trace)
    names = list(trace.domains) + ["unknown"]
    change = np.flatnonzero(np.concatenate([[True], dom[1:] != dom[:-1]]))
    return [(int(i), names[dom[i]]) for i in change]
