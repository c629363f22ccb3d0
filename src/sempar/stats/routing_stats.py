"""Mergeable routing statistics: `RoutingStats`, built block by block, merged shard by shard.

A `RoutingStats` summarises a trace (or the concatenation of trace shards, in order) with what
the placement objectives and evaluations that need no raw order read:

- `loads` int64[L, N]: token-expert activations per layer (always);
- requests (always): `request_ids` int64[R] sorted, `request_rows` int64[R] rows each;
- `sample` (part "sample"): the rows of a seeded sample of whole requests of at most
  `sample_rows` rows (`stats.sample`), with their row index in the whole trace, in
  trace order: the rows objective's fit sample (`placement/sempar/rows.py`);
- `tokens` (part "tokens", traces with token ids): per layer the token x expert counts
  c[l, u, e] as CSR [V, N] (int32 counts in memory while the rows fit, `sketch.count_dtype`;
  int64 as read from a file) (Sem-MoE §3.2's activation table T^(l), rows by token id), kept
  to at most `token_cells` cells a layer as a Misra-Gries summary (`stats.sketch`: every
  count read low by at most `token_error[l]` <= k x rows / (token_cells + 1); exact, error
  0, while the cap is not reached; `token_cells` 0: no cap), with `token_occurrences`
  int64[V], each token's exact occurrence count;
- `coactivation` (part "coactivation") int64[L, N, N]: rows selecting both e and f at layer l
  (X^T X of the one-hot selections; the diagonal is `loads`);
- `transitions` (part "transitions") int64[L-1, N, N]: rows selecting e at layer l and f at
  layer l+1 (all k x k pairs; ExFlow's inter-layer affinity counts);
- `request_experts` (part "request-experts"): per layer the request x expert counts (Alg. 2's
  Q, for dp mode) as CSR [R, N].

Merging (`merge`) is associative and exact but for capped token tables: the counts of a
concatenation are the sums of the shards' (bit for bit; capped token tables: summed, then
reduced to the cap, their error bounds added, `stats.sketch`), and the sample of a
concatenation is the sample rule applied to the
union of the shards' samples (`stats.sample`'s docstring says why), the second operand's row
indices shifted by the first's row count. Requests must not straddle shards (refused, one
line). Shards of different models (`TraceMeta.model_difference`: name, type or shape) are
refused, one line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse

from sempar.stats.sample import below, bottom_requests, cut_after, request_priority
from sempar.stats.sketch import add_reduce, count_dtype
from sempar.errors import InputError
from sempar.stats.parts import DEFAULT_PARTS, PARTS, STATS_PARTS
from sempar.trace.schema import RoutingTrace, TraceMeta

SAMPLE_ROWS = 200_000                          # `SemparConfig.row_sample`'s default
SAMPLE_COLUMNS = ("row", "token_id", "request_id", "position", "experts", "domain")


def resolve_parts(parts: tuple[str, ...] | list[str], meta: TraceMeta) -> tuple[str, ...]:
    """The parts to build, in `PARTS` order: `parts` checked, those that need token ids dropped
    on a trace without them."""
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise InputError(f"--parts: {bad[0]!r} is not one of {', '.join(PARTS)}")
    return tuple(p for p in PARTS if p in parts
                 and (meta.has_token_ids or not STATS_PARTS.get(p).needs_token_ids))


@dataclass
class RoutingStats:
    """A mergeable summary of routing (module docstring). `shards`: [(name, rows)] in order."""

    meta: TraceMeta
    domains: list[str]
    parts: tuple[str, ...]
    seed: int
    sample_rows: int
    shards: list[tuple[str, int]]
    loads: np.ndarray                                   # int64[L, N]
    request_ids: np.ndarray                             # int64[R], sorted
    request_rows: np.ndarray                            # int64[R]
    sample: dict[str, np.ndarray] | None = None         # SAMPLE_COLUMNS -> [S, ...]
    tokens: list[sparse.csr_matrix] | None = None       # L x CSR int[V, N] (`count_dtype`)
    coactivation: np.ndarray | None = None              # int64[L, N, N]
    transitions: np.ndarray | None = None               # int64[L-1, N, N]
    request_experts: list[sparse.csr_matrix] | None = None   # L x CSR int64[R, N]
    sample_cut: tuple[int, int] | None = None   # (priority, id) of the first left-out request
    token_cells: int = 0                                # cap on a token table's cells; 0: none
    token_error: np.ndarray | None = None               # int64[L]: `stats.sketch`'s bound
    token_occurrences: np.ndarray | None = None         # int64[V]: occurrences of each token
    extra: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(sum(n for _, n in self.shards))

    def require(self, part: str, what: str) -> None:
        """Bad input when the stats were built without `part` (`what` needs it)."""
        if part not in self.parts:
            raise InputError(f"{what} needs the stats part {part!r}; rebuild with "
                             f"`sempar stats build --parts ...,{part}`")

    def sample_trace(self) -> RoutingTrace:
        """The sampled rows as a `RoutingTrace`, in trace order (the rows objective's fit)."""
        self.require("sample", "a placement from statistics")
        s = self.sample
        return RoutingTrace(self.meta, s["token_id"], s["request_id"], s["position"],
                            s["experts"], domain=s.get("domain"), domains=list(self.domains))


# ----------------------------------------------------------------------------------- merging

def check_same_model(a: RoutingStats, b: RoutingStats, where: str) -> None:
    """One line when `b` cannot be merged into `a` (model shape, parts, sample settings)."""
    diff = a.meta.model_difference(b.meta)
    if diff:
        raise InputError(f"{where}: another model ({diff}: {getattr(a.meta, diff)!r} vs "
                         f"{getattr(b.meta, diff)!r}); shards of one trace only")
    for name in ("parts", "seed", "sample_rows", "token_cells"):
        if getattr(a, name) != getattr(b, name):
            raise InputError(f"{where}: built with another {name} ({getattr(a, name)!r} vs "
                             f"{getattr(b, name)!r})")
    if a.domains != b.domains and a.domains and b.domains:
        raise InputError(f"{where}: other domain names ({a.domains} vs {b.domains})")


def _cat_sample(a: dict, b: dict, shift: int, keep: np.ndarray | None = None) -> dict:
    """a's sample rows then b's (b's row indices shifted by `shift`); with `keep` bool[|a| +
    |b|] only those rows, cut column by column (no uncut copy of both samples: two 200k-row
    DeepSeek-V3 samples are 0.4 GB)."""
    out = {}
    na = a["request_id"].size
    for key in a:
        x, y = a[key], b[key]
        if keep is not None:
            x, y = x[keep[:na]], y[keep[na:]]
        out[key] = np.concatenate([x, y + shift if key == "row" else y])
    return out


def _resample_mask(sample_ids: np.ndarray, request_ids: np.ndarray, request_rows: np.ndarray,
                   max_rows: int, seed: int, cut: tuple[int, int] | None
                   ) -> tuple[np.ndarray, tuple[int, int] | None]:
    """(the rows of a sample the sample rule keeps, bool[S] over its rows, whose request ids
    are `sample_ids` int[S]; the new cut): the rule applied to the sample's requests ordered
    before `cut` (the operands' lowest), `request_ids` int64[R] with `request_rows` int64[R]
    giving their sizes."""
    in_sample = np.isin(request_ids, sample_ids)
    ids, rows = request_ids[in_sample], request_rows[in_sample]
    prio = request_priority(ids, seed)
    ok = below(prio, ids, cut)
    ids, rows, prio = ids[ok], rows[ok], prio[ok]
    chosen = bottom_requests(prio, ids, rows, max_rows)
    new = cut_after(prio, ids, chosen)
    return np.isin(sample_ids, ids[chosen]), _lowest(cut, new)


def _lowest(a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int] | None:
    if a is None or b is None:
        return b if a is None else a
    return min(a, b)


def merge(a: RoutingStats, b: RoutingStats, where: str = "stats", *,
          consume: bool = False) -> RoutingStats:
    """The stats of a's trace followed by b's (module docstring). `consume`: a and b are not
    used again (a running merge), so the token tables are summed layer by layer in place and
    each operand's layer dropped as soon as it is summed: the merge then holds one layer's
    sum beside the operands, not a second copy of every table."""
    check_same_model(a, b, where)
    both = np.intersect1d(a.request_ids, b.request_ids)
    if both.size:
        raise InputError(f"{where}: request {int(both[0])} appears in two shards; a request's "
                         f"rows must stay in one shard")
    ids = np.concatenate([a.request_ids, b.request_ids])
    rows = np.concatenate([a.request_rows, b.request_rows])
    order = np.argsort(ids, kind="stable")
    out = dataclasses.replace(
        a, domains=a.domains or b.domains, shards=a.shards + b.shards, loads=a.loads + b.loads,
        request_ids=ids[order], request_rows=rows[order], extra=dict(a.extra))
    if a.sample is not None:
        both_ids = np.concatenate([a.sample["request_id"], b.sample["request_id"]])
        keep, out.sample_cut = _resample_mask(both_ids, out.request_ids, out.request_rows,
                                              a.sample_rows, a.seed,
                                              _lowest(a.sample_cut, b.sample_cut))
        out.sample = _cat_sample(a.sample, b.sample, a.rows, keep)
    if a.tokens is not None:
        tables = a.tokens if consume else list(a.tokens)
        error = a.token_error + b.token_error
        dtype = count_dtype(a.rows + b.rows)
        for l in range(len(tables)):
            tables[l], t = add_reduce(tables[l], b.tokens[l], a.token_cells, dtype)
            error[l] += t
            if consume:
                b.tokens[l] = None
        out.tokens, out.token_error = tables, error
        out.token_occurrences = a.token_occurrences + b.token_occurrences
    if a.coactivation is not None:
        out.coactivation = a.coactivation + b.coactivation
    if a.transitions is not None:
        out.transitions = a.transitions + b.transitions
    if a.request_experts is not None:
        # a's rows then b's, reordered like the merged (sorted) request ids
        out.request_experts = [sparse.vstack([x, y], format="csr")[order]
                               for x, y in zip(a.request_experts, b.request_experts)]
    return out


def merge_all(stats: list[RoutingStats], names: list[str] | None = None) -> RoutingStats:
    """The stats of the shards' concatenation, in list order (a left fold of `merge`)."""
    out = stats[0]
    for i, s in enumerate(stats[1:], start=1):
        out = merge(out, s, names[i] if names else f"shard {i}")
    return out
