"""Issue 37: `sempar bench`'s Alg. 2 (`sempar-dp`) and `evaluate --mode dp --online` are one code
path (`OnlineScheduler.request_ranks`); on the same requests they give the same ranks and LAR.

The figures the issue compared (bench 0.254, evaluate 0.264 on tiny-moe64 at EP 4) differ by
their request samples: the bench scores 2 x 8 held-out requests cut to 128 tokens, evaluate all
1,898 held-out requests at full length (docs/router.md)."""

from __future__ import annotations

import numpy as np
import pytest

from sempar.bench.inputs import batch_trace, load_dev, prefill_batches
from sempar.bench.plan import plan_specs, predicted
from sempar.schedule.online import model_embedding, online_figures
from sempar.schedule.requests import request_arrays

MODEL, G = "tiny-moe64", 4


@pytest.fixture(scope="module")
def bench_runs():
    fit, held = load_dev(MODEL)
    ids = prefill_batches(held, 2, 8, 32)
    specs, ctx, placements, _ = plan_specs(G, ids, ["sempar-dp"], MODEL, repeats=1)
    return fit, specs, ctx, placements["semmoe"]


def test_bench_and_evaluate_route_alike(bench_runs):
    fit, specs, ctx, placement = bench_runs
    oov = model_embedding(MODEL)
    for spec, c in zip(specs, ctx):
        tr = batch_trace(fit.meta, spec.input_ids, c["experts"])
        # evaluate --online's figure (its own function, its own LAR rule) on the bench's requests
        ev = online_figures(placement, fit, tr, "dp", oov)["predicted_lar_mean"]
        bench_lar = predicted(spec, c["experts"], 64)[2]      # bench's simulator LAR
        assert bench_lar == pytest.approx(ev, abs=1e-9)
        # and the ranks are Alg. 2's on the fitted table, not a round-robin stand-in
        from sempar.schedule.online import OnlineScheduler
        from sempar.schedule.requests import REQUEST_POLICIES

        sched = OnlineScheduler(oov=oov).fit(fit, placement)
        tok, off, _ = request_arrays(tr.request_id, tr.token_id)
        alg2 = REQUEST_POLICIES.get("alg2")(G, sched.token_device_.table_)
        np.testing.assert_array_equal(spec.request_rank.numpy(),
                                      alg2.assign(sched._mapped(tok), off))


def test_request_ranks_follow_arrival_order(bench_runs):
    """Requests are ranked in order of first appearance, whatever their ids: a trace whose
    request ids run backwards gets the same ranks request by request."""
    from sempar.schedule.online import OnlineScheduler
    from sempar.trace.schema import RoutingTrace

    fit, specs, ctx, placement = bench_runs
    spec, c = specs[0], ctx[0]
    tr = batch_trace(fit.meta, spec.input_ids, c["experts"])
    flipped = RoutingTrace(meta=tr.meta, token_id=tr.token_id, request_id=100 - tr.request_id,
                           position=tr.position, experts=tr.experts)
    sched = OnlineScheduler(oov=model_embedding(MODEL)).fit(fit, placement)
    np.testing.assert_array_equal(sched.request_ranks(flipped), sched.request_ranks(tr))
    np.testing.assert_array_equal(sched.home_dp(flipped), sched.home_dp(tr))
