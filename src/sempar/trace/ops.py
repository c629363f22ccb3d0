"""Operations on whole traces: split by request, split by token, concatenate, select domains."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from sempar.errors import InputError
from sempar.trace.schema import RoutingTrace

FIT_FRACTION = 0.2  # docs/design.md, Evaluation protocol: 20% to profile, 80% to evaluate


def split_by_request(trace: RoutingTrace, fit_fraction: float = FIT_FRACTION,
                     seed: int = 0) -> tuple[RoutingTrace, RoutingTrace]:
    """Split into (fit, eval) by whole requests: a seeded random `fit_fraction` of the requests.

    Token order inside each part is the original order. With a single request both parts cannot
    be non-empty, so at least two requests are required.
    """
    if not 0.0 < fit_fraction < 1.0:
        raise InputError(f"fit_fraction: {fit_fraction} is not in (0, 1)")
    requests = np.unique(trace.request_id)
    if requests.size < 2:
        raise InputError(f"request_id: the trace holds {requests.size} request(s); a split by "
                         "request needs at least 2")
    rng = np.random.default_rng(seed)
    n_fit = min(max(1, int(round(fit_fraction * requests.size))), requests.size - 1)
    fit_requests = rng.permutation(requests)[:n_fit]
    in_fit = np.isin(trace.request_id, fit_requests)
    return trace.take(in_fit), trace.take(~in_fit)


def split_by_token(trace: RoutingTrace, fit_fraction: float,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """bool[T] masks (fit, score) of a seeded random `fit_fraction` of the tokens.

    This is the protocol of Sem-MoE A.2 / Table 1 (25% of the profile to fit, 75% to score).
    """
    if not 0.0 < fit_fraction < 1.0:
        raise InputError(f"fit_fraction: {fit_fraction} is not in (0, 1)")
    rng = np.random.default_rng(seed)
    fit = rng.random(trace.num_tokens) < fit_fraction
    return fit, ~fit


def concat(traces: Sequence[RoutingTrace]) -> RoutingTrace:
    """Concatenate traces of the same model shape.

    Request ids of each later trace are shifted past the largest id so far, so requests of
    different traces never merge; domain lists are merged by name.
    """
    if not traces:
        raise InputError("concat: no traces given")
    first = traces[0]
    for i, t in enumerate(traces[1:], start=1):
        diff = first.meta.first_difference(t.meta)
        if diff:
            raise InputError(f"metadata.{diff}: trace {i} has {getattr(t.meta, diff)!r}, "
                             f"trace 0 has {getattr(first.meta, diff)!r}")
    if len({t.weights is None for t in traces}) > 1:
        raise InputError("weights: some traces have router weights and others do not")
    domains: list[str] = []
    for t in traces:
        domains += [d for d in t.domains if d not in domains]
    has_domain = any(t.domain is not None for t in traces)
    request_parts, domain_parts = [], []
    offset = 0
    for t in traces:
        request_parts.append(t.request_id.astype(np.int64) + offset)
        if t.num_tokens:
            offset = int(request_parts[-1].max()) + 1
        if has_domain:
            if t.domain is None:
                domain_parts.append(np.full(t.num_tokens, -1, np.int16))
            else:
                remap = np.array([domains.index(d) for d in t.domains] + [-1], np.int16)
                domain_parts.append(remap[np.where(t.domain < 0, len(t.domains), t.domain)])
    request_id = np.concatenate(request_parts)
    if request_id.size and request_id.max() > np.iinfo(np.int32).max:
        raise InputError("request_id: concatenated request ids overflow int32")
    meta = first.meta
    if not all(t.meta.has_token_ids for t in traces):   # zeros of one part are no ids
        meta = dataclasses.replace(meta, has_token_ids=False)
    if not all(t.meta.slots_sorted for t in traces):    # one unsorted part: slot 0 unknown
        meta = dataclasses.replace(meta, slots_sorted=False)
    return RoutingTrace(
        meta=meta,
        token_id=np.concatenate([t.token_id for t in traces]),
        request_id=request_id.astype(np.int32),
        position=np.concatenate([t.position for t in traces]),
        experts=np.concatenate([t.experts for t in traces]),
        domain=np.concatenate(domain_parts) if has_domain else None,
        domains=domains if has_domain else [],
        weights=None if traces[0].weights is None else np.concatenate([t.weights for t in traces]),
        # known for the whole only when every part says it
        decode=np.concatenate([t.decode for t in traces])
        if all(t.decode is not None for t in traces) else None,
    )


def without_token_ids(trace: RoutingTrace) -> RoutingTrace:
    """The trace marked as having no token ids (its token_id column zeros); itself when it
    has none already."""
    if not trace.meta.has_token_ids:
        return trace
    return dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, has_token_ids=False),
                               token_id=np.zeros_like(trace.token_id))


def select_domains(trace: RoutingTrace, names: Sequence[str]) -> RoutingTrace:
    """The tokens whose domain is one of `names` (unknown names raise `InputError`)."""
    unknown = [n for n in names if n not in trace.domains]
    if unknown:
        raise InputError(f"domain: {unknown[0]!r} is not in this trace (it has: "
                         f"{', '.join(trace.domains) or 'no domains'})")
    codes = [trace.domains.index(n) for n in names]
    return trace.take(np.isin(trace.domain, codes))
