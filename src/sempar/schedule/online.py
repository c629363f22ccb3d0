"""Online data scheduling judged on held-out routing: `sempar evaluate --online` (issue 5).

`evaluate` without `--online` places eval tokens with the solver's own token table, most
confident first (`placement.metrics.home_tp_table`). Here the tokens are placed by the schedulers
that would run in the engine, through their real code paths, fitted on the fit trace only:

- tp mode (Sem-MoE Alg. 3, s-MoE Alg. 2): per (token, layer) the token table T
  (`TokenDevice`) and the device n-gram table A (`DeviceNgram`, look-back n, fed the token's
  real device states at the previous layers, which the pipelined flow knows when layer l's
  router runs) each predict a device; `rebatch.choose_devices` keeps the more confident one
  and `rebatch.plan_align` re-batches every batch of 2,048 tokens into equal per-device chunks,
  a full device keeping its most confident tokens (ours; the paper leaves it open). The chunk a
  token lands in is its home at that layer.
- dp mode (Sem-MoE Alg. 2): a request policy of `schedule.requests` puts each whole request on a
  DP rank from its tokens' rows of T; the rank is its home at every layer.

Choices (ours): T's confidence is the "state" confidence of `TokenDevice` (how often the token's
real device state was T's device in the fit trace), because the paper's activation-share Tp is
not comparable with Ap and lets A win where T is right (measured on tiny-moe64 at EP 4: state
accuracy 0.608 with the share, 0.675 with the state confidence). Unseen eval tokens are mapped
to their nearest fit token by input-embedding cosine when the trace's model is one of ours on
disk (`model_embedding`), else they have no preference and fill the room left in the batch.
The table T is fitted for the placement given, so placement-only methods (vanilla, eplb, ...)
get data scheduling too; a co-clustering solver's own table assigns the same devices.
"""

from __future__ import annotations

import numpy as np
import torch

from sempar.errors import InputError
from sempar.placement.capacity import ASSIGN_RULES, BATCH, DEFAULT_ASSIGN, capacity_home
from sempar.placement.metrics import placement_figures
from sempar.placement.placement import Placement
from sempar.predict import DeviceNgram, EmbeddingOOV, TokenDevice, combine, prediction_accuracy
from sempar.schedule.homes import home_from_ranks, oracle_home, rebatched_home
from sempar.schedule.requests import REQUEST_POLICIES, request_arrays
from sempar.trace.schema import RoutingTrace, require_token_ids

LOOKBACK = 2          # Sem-MoE B.1's default look-back
# expected hits quantised to 1 / HITS_SCALE for the optimal rule's integer flow (scores lie
# in [0, k]; 1/64 keeps their order wherever it matters to a local activation)
HITS_SCALE = 64


def model_embedding(model: str) -> EmbeddingOOV | None:
    """The OOV mapper of one of our tiny models (by trace metadata name), or None."""
    from sempar.paths import packaged_model_dir
    from sempar.predict.oov import load_input_embedding

    d = packaged_model_dir(model)
    if d is None:
        return None
    return EmbeddingOOV(load_input_embedding(d))


class OnlineScheduler:
    """Fitted T and A for one placement: `fit(fit_trace, placement)`, then `home_tp` / `home_dp`.

    Learned: `token_device_` (TokenDevice), `ngram_` (DeviceNgram).
    """

    def __init__(self, lookback: int = LOOKBACK, oov: EmbeddingOOV | None = None,
                 rebatch: str = "align", batch: int = BATCH):
        self.lookback, self.oov, self.rebatch, self.batch = lookback, oov, rebatch, batch

    def fit(self, trace: RoutingTrace, placement: Placement) -> "OnlineScheduler":
        require_token_ids(trace.meta, "the online schedulers")
        self.placement_, self.fit_trace_, self.hits_ = placement, trace, None
        self.token_device_ = TokenDevice(self.oov, confidence="state").fit(trace, placement)
        self.ngram_ = DeviceNgram(self.lookback).fit(trace, placement)
        return self

    def predict(self, trace: RoutingTrace) -> tuple[np.ndarray, np.ndarray]:
        """(device int16[T, L], confidence float32[T, L]): the device Alg. 3 prefers for each
        (token, layer), -1 = none, and the confidence of the table it came from."""
        require_token_ids(trace.meta, "the online schedulers")
        t_dev, t_conf = self.token_device_.predict(trace.token_id)
        a_dev, a_conf = self.ngram_.predict_trace(trace)
        return combine(t_dev, t_conf, a_dev, a_conf)

    def home(self, trace: RoutingTrace, mode: str, policy: str = "alg2") -> np.ndarray:
        """int32[T, L]: `home_tp` (mode "tp") or `home_dp` with `policy` (mode "dp")."""
        return self.home_tp(trace) if mode == "tp" else self.home_dp(trace, policy)

    def home_tp(self, trace: RoutingTrace) -> np.ndarray:
        """int32[T, L]: each token's chunk after re-batching every batch at every layer."""
        dev, conf = self.predict(trace)
        return rebatched_home(torch.from_numpy(dev.astype(np.int64)), self.placement_.num_devices,
                              torch.from_numpy(conf), self.batch, self.rebatch)

    def home_tp_hits(self, trace: RoutingTrace, rule: str = DEFAULT_ASSIGN) -> np.ndarray:
        """int32[T, L]: homes from `ExpectedHits` scores (ours, beside Alg. 3's T|A), equal
        shares per batch and layer. rule "optimal" (the default, issue 46): the assignment with
        the most expected hits within the shares (`capacity.ASSIGN_RULES`, on the scores
        quantised to 1 / HITS_SCALE); "proposal": each token asks its best-scored device, a full
        device keeps the tokens with the most expected hits, a spilled token asks its own
        next-best (`plan_align` scores). Measured on GPT-OSS-20B (benchmarks/
        bench_online_home_rule.py): the optimal rule +0.007 / +0.011 held-out LAR at EP 4 / 8,
        at less host time a batch than the proposal path."""
        from sempar.predict.expected_hits import ExpectedHits

        ASSIGN_RULES.get(rule)
        if getattr(self, "hits_", None) is None:
            self.hits_ = ExpectedHits(self.oov).fit(self.fit_trace_, self.placement_)
        if rule == "optimal":
            q = np.rint(self.hits_.scores(trace) * HITS_SCALE).astype(np.int64)   # [T, L, G]
            home = np.empty(q.shape[:2], np.int32)
            for l in range(q.shape[1]):
                home[:, l] = capacity_home(q[:, l], self.batch, rule=rule)
            return home
        S = torch.from_numpy(self.hits_.scores(trace))                     # [T, L, G]
        best, target = S.max(dim=2)
        return rebatched_home(target, self.placement_.num_devices, best, self.batch, "align",
                              scores=S)

    def request_ranks(self, trace: RoutingTrace, policy: str = "alg2") -> np.ndarray:
        """int[R]: the DP rank of each request of `trace`, requests in arrival order (first
        appearance, `requests.request_arrays`), from `policy` (Sem-MoE Alg. 2 by default) on the
        fitted token table T, unseen tokens mapped by the OOV embedding. The one Alg. 2 code path
        of `evaluate --mode dp --online` (through `home_dp`) and `sempar bench`'s `sempar-dp`."""
        require_token_ids(trace.meta, "the online request policies")
        tokens, offsets, _ = request_arrays(trace.request_id, trace.token_id)
        sched = REQUEST_POLICIES.get(policy)(self.placement_.num_devices, self.token_device_.table_)
        return sched.assign(self._mapped(tokens), offsets)

    def home_dp(self, trace: RoutingTrace, policy: str = "alg2") -> np.ndarray:
        """int32[T, L]: every token on its request's DP rank (`request_ranks`)."""
        return home_from_ranks(trace.request_id, self.request_ranks(trace, policy),
                               trace.meta.num_layers)

    def _mapped(self, token_id: np.ndarray) -> np.ndarray:
        oov = self.token_device_.oov_
        return oov.map(np.asarray(token_id, np.int64)) if oov is not None else token_id


def online_figures(placement: Placement, fit: RoutingTrace, eval_: RoutingTrace, mode: str,
                   oov: EmbeddingOOV | None = None, lookback: int = LOOKBACK,
                   policy: str = "alg2", chunk_slack: float = 0.0) -> dict:
    """{"predicted_lar_mean", "predicted_lar" float[L], "predicted_imbalance_max_mean",
    "accuracy": {"token_mean", "ngram_mean", "combined_mean"}} of the online schedulers
    (Alg. 3's T|A), in tp mode "hits_lar_mean" / "hits_lar" of ours (`home_tp_hits`), and the
    exact pre-routed source's figures (`exact_figures`, with `chunk_slack`)."""
    if mode not in ("tp", "dp"):
        raise InputError(f"--mode: {mode!r} is not one of dp, tp")
    sched = OnlineScheduler(lookback, oov).fit(fit, placement)
    home = sched.home(eval_, mode, policy)
    f = placement_figures(placement, eval_.experts, home)
    acc = prediction_accuracy(eval_, placement, sched.token_device_, sched.ngram_)
    out = {"predicted_lar_mean": f["lar_mean"], "predicted_lar": np.round(f["lar"], 4).tolist(),
           "predicted_imbalance_max_mean": f["imbalance_max_mean"],
           "accuracy": {k: float(acc[f"{k}_mean"]) for k in ("token", "ngram", "combined")}}
    if mode == "tp":
        h = placement_figures(placement, eval_.experts, sched.home_tp_hits(eval_))
        out |= {"hits_lar_mean": h["lar_mean"], "hits_lar": np.round(h["lar"], 4).tolist()}
    return out | exact_figures(placement, eval_, mode, chunk_slack=chunk_slack)


def exact_figures(placement: Placement, eval_: RoutingTrace, mode: str,
                  batch: int = BATCH, chunk_slack: float = 0.0) -> dict:
    """The pre-routed source (tp mode only; dp mode cannot re-home a token inside a layer):
    {"exact_lar_mean", "exact_lar" float[L], "exact_imbalance_max_mean",
    "selection_agreement": share of (token, layer) whose pre-routed top-k is the router's, or
    None}.

    The homes are the pre-router's (`schedule.homes.oracle_home`) of the eval trace's recorded
    experts: what the pre-router selects when it agrees with the router. The agreement itself is
    measured, when the trace's model is one of ours on disk, by re-running it on the first eval
    requests (`agreement.trace_agreement`); None otherwise.
    """
    if mode != "tp":
        return {"exact_lar_mean": None, "exact_lar": None, "exact_imbalance_max_mean": None,
                "selection_agreement": None}
    from sempar.schedule.agreement import trace_agreement

    home = oracle_home(placement, eval_.experts, batch, chunk_slack)
    f = placement_figures(placement, eval_.experts, home)
    agree = trace_agreement(eval_, placement.num_devices)
    return {"exact_lar_mean": f["lar_mean"], "exact_lar": np.round(f["lar"], 4).tolist(),
            "exact_imbalance_max_mean": f["imbalance_max_mean"],
            "selection_agreement": None if agree is None else agree["agreement"]}


class OnlineHomes:
    """`home(placement, fit, eval, mode)` for `cross_dataset_matrix`: the online schedulers, fitted
    once per placement (cached) and applied to each eval trace."""

    def __init__(self, oov: EmbeddingOOV | None = None, lookback: int = LOOKBACK,
                 policy: str = "alg2"):
        self.oov, self.lookback, self.policy = oov, lookback, policy
        self._fitted: dict[int, OnlineScheduler] = {}

    def __call__(self, placement: Placement, fit: RoutingTrace, eval_: RoutingTrace,
                 mode: str) -> np.ndarray:
        key = id(placement)
        if key not in self._fitted:
            self._fitted = {key: OnlineScheduler(self.lookback, self.oov).fit(fit, placement)}
        return self._fitted[key].home(eval_, mode, self.policy)
