"""Serving metrics of one run and the SLO figures (Sem-MoE §5 and s-MoE §5 "Metrics").

Per request: TTFT = first token - arrival; E2E = last token - arrival; TPOT = (E2E - TTFT) /
(output tokens - 1) (s-MoE: decoding time over tokens generated). A request not finished by
the horizon counts as infinitely late. TBT is measured per request (`request_gaps`): over each
request's span, from the iteration that emitted its first token to the one that emitted its
last (or the horizon), the intervals between consecutive iteration ends -- wall time, so
nothing between two of its tokens is left out. The p90 is over all requests' gaps. The engine
gives every running request a token in every iteration of its span (KV reserved at admission,
budget >= running requests; tests/serving check it), so these gaps are its token gaps and the
figure equals the iterations' durations weighted by their decode tokens; under overload it
falls because admission caps the prefill per iteration (docs/serving.md).

Throughput: tokens processed (prefill + decode) per second from the first arrival to the end of
the last iteration (the horizon if the run was cut), as SGLang's bench_serving divides total
tokens by the benchmark's duration (Sem-MoE: "tokens an inference system can process per unit
time"); `output_throughput` counts generated tokens only.

SLO statistics (one per SLO key): `ttft` -> p99 TTFT and `e2e` -> median E2E (Sem-MoE Table 2's
figures), `tpot` -> mean TPOT (s-MoE: "average time to generate an output token"), `p90_tbt` ->
p90 TBT. The SLO is `slo_scale` (5) x that statistic under the lightest load (both papers), or
given. A rate meets an SLO when the statistic is within it; the highest rate that does is
searched in slo_search.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sempar.serving.engine import RunLog, Workload

SLO_KEYS = ("ttft", "tpot", "p90_tbt", "e2e")
SLO_STAT = {"ttft": "ttft_p99", "tpot": "tpot_mean", "p90_tbt": "p90_tbt", "e2e": "e2e_p50"}


@dataclass(frozen=True)
class SLOSpec:
    """The SLO a forecast judges by: `keys` that must hold together (`plan`; `serve-sim`
    searches each of SLO_KEYS alone), each at `scale` x its statistic under the lightest load
    of the baseline, unless `given` in seconds ({key: s}, `--slo`; given keys replace `keys` in
    `plan`)."""

    keys: tuple[str, ...] = ("ttft", "e2e")
    scale: float = 5.0
    given: dict = field(default_factory=dict)

    def slos(self, light: dict) -> dict:
        """SLO per key (slos_from) from the lightest load's figures."""
        return slos_from(light, self.scale, self.given)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-quantile (0..1) of `values` repeated `weights` times (inverted CDF)."""
    keep = weights > 0
    if not keep.any():
        return float("nan")
    v, w = values[keep], weights[keep]
    o = np.argsort(v, kind="stable")
    c = np.cumsum(w[o])
    return float(v[o][np.searchsorted(c, q * c[-1], side="left")])


def request_gaps(log: RunLog) -> tuple[np.ndarray, np.ndarray]:
    """(gap float64[I], count float64[I]): per iteration, the wall time since the previous
    iteration's end, and how many requests' spans hold it (a request's gaps are the intervals
    of the iterations first_it[r] + 1 .. last_it[r]); counted with a difference array,
    O(R + I)."""
    I = log.it_end.size
    if log.first_it is None or I == 0:      # a log from before per-request spans
        return log.it_dt, log.it_decode
    ok = log.first_it >= 0
    lo, hi = log.first_it[ok] + 1, log.last_it[ok] + 1
    diff = np.bincount(lo, minlength=I + 1)[:I + 1] - np.bincount(hi, minlength=I + 1)[:I + 1]
    count = np.cumsum(diff)[:I].astype(np.float64)
    gap = np.diff(log.it_end, prepend=log.it_end[0] - log.it_dt[0])
    return gap, count


def run_metrics(w: Workload, log: RunLog, duration: float) -> dict:
    """Figures of one run; latencies in seconds, throughputs in tokens/s."""
    late = np.inf
    ttft = np.where(np.isnan(log.first_token), late, log.first_token - w.arrival)
    e2e = np.where(np.isnan(log.finish), late, log.finish - w.arrival)
    multi = w.out_len > 1
    done = np.isfinite(e2e)
    tpot = np.full(w.size, late)
    tpot[done] = (e2e[done] - ttft[done]) / np.maximum(1, w.out_len[done] - 1)
    tpot = tpot[multi]
    span = float(log.it_end[-1]) if log.it_end.size else duration
    out_tok = float(log.it_decode.sum() + np.isfinite(log.first_token).sum())

    def pct(a, q):                      # unfinished requests (inf) make a tail inf, not nan
        if not a.size:
            return float("nan")
        fin = np.isfinite(a)
        if fin.all():
            return float(np.percentile(a, q))
        rank = q / 100 * (a.size - 1)
        return float(np.percentile(a[fin], min(100.0, q * (a.size - 1) / max(1, fin.sum() - 1)))) \
            if np.ceil(rank) < fin.sum() else float("inf")

    return {
        "requests": int(w.size), "finished": int(np.isfinite(e2e).sum()),
        "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
        "tpot_mean": float(tpot.mean()) if tpot.size else float("nan"), "tpot_p99": pct(tpot, 99),
        "p90_tbt": weighted_quantile(*request_gaps(log), 0.9),
        "e2e_p50": pct(e2e, 50), "e2e_p99": pct(e2e, 99),
        "throughput": float(log.it_tokens.sum() / span),
        "output_throughput": out_tok / span,
        "iterations": int(log.it_dt.size),
        "mean_batch_tokens": float(log.it_tokens.mean()) if log.it_tokens.size else 0.0,
    }


def slos_from(light: dict, scale: float, given: dict | None = None) -> dict:
    """SLO per key: given, else scale x the lightest-load statistic."""
    given = given or {}
    return {k: float(given[k]) if k in given else scale * light[SLO_STAT[k]] for k in SLO_KEYS}
