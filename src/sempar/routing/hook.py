"""Apply cost-aware gate bias to a Hugging Face MoE model's routers (CAMoE §3.4, eq. 13).

`CostRoutingHook` is a context manager. On entry it replaces the `forward` of every router
module found by `sempar.trace.routers.find_routers` (an instance attribute shadowing the class
method); on exit it removes it again, so the model is exactly as before (also when the forward
raised). Inside, each router computes its logits Z exactly as transformers does, adds row
`home[i]` of its layer's table (`S G^(l)`, float32[G, E] cast to the logits' dtype) and then
selects the top-k with the family's own rule (table below, copied from transformers 5.x): no
retraining, no change to parameters or FLOPs.

| model_type                     | logits                      | selection after the bias           |
| ------------------------------ | --------------------------- | ---------------------------------- |
| mixtral, qwen2_moe, qwen3_moe, | linear(h, W)                | top-k of softmax(Z'), renormalised |
| olmoe                          |                             | (qwen/olmoe: if norm_topk_prob)    |
| gpt_oss                        | linear(h, W, b)             | top-k of Z', softmax over the k    |
| deepseek_v3                    | linear(h.float, W.float)    | sigmoid(Z') + e_score_correction,  |
|                                |                             | group-limited top-k                |

`mode="logits"` (CAMoE: Z' replaces Z, so the bias moves both the choice and the mixing
weights) or `mode="select"` (ours, like DeepSeek-V3's correction bias: Z' chooses the experts,
the weights are the unbiased ones at the chosen experts, renormalised the family's way). The
router's first output (`router_logits`, used only for the auxiliary loss) is Z'.

With a zero table (lambda = 0) the router's own forward runs (`passthrough_at_zero`), so the
model's outputs are bit-identical; with `passthrough_at_zero=False` the re-implementation runs
and is bit-identical too (tested), which checks it against transformers.

Token homes (`S`, the source device of each row of the flattened [batch * seq, hidden] router
input) are given per forward with `set_sources(int[rows])`; when none is given, row i is on
device i mod G (design.md's vanilla position split).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from sempar.errors import InputError, check_choice
from sempar.trace.routers import RouterSite, find_routers

BIAS_MODES = ("logits", "select")


# --------------------------------------------------------------------------- family routers

def _softmax_family(always_norm: bool, fp32_via_cast: bool, cast_back: bool) -> Callable:
    def route(module: Any, hidden_states: Any, bias_fn: Callable, mode: str):
        import torch
        import torch.nn.functional as F

        hidden_states = hidden_states.reshape(-1, module.hidden_dim)
        logits = F.linear(hidden_states, module.weight)
        biased = logits + bias_fn(logits)

        def probs_of(z):
            if fp32_via_cast:
                return torch.nn.functional.softmax(z.float(), dim=-1)
            return torch.nn.functional.softmax(z, dtype=torch.float, dim=-1)

        probs = probs_of(biased)
        top_value, indices = torch.topk(probs, module.top_k, dim=-1)
        if mode == "select":
            top_value = probs_of(logits).gather(1, indices)
        if always_norm or module.norm_topk_prob:
            top_value /= top_value.sum(dim=-1, keepdim=True)
        if cast_back:
            top_value = top_value.to(logits.dtype)
        return biased, top_value, indices

    return route


def _gpt_oss(module: Any, hidden_states: Any, bias_fn: Callable, mode: str):
    import torch
    import torch.nn.functional as F

    logits = F.linear(hidden_states, module.weight, module.bias)
    biased = logits + bias_fn(logits)
    top_value, indices = torch.topk(biased, module.top_k, dim=-1)
    if mode == "select":
        top_value = logits.gather(-1, indices)
    scores = torch.nn.functional.softmax(top_value, dim=1, dtype=top_value.dtype)
    return biased, scores, indices


def _deepseek_v3(module: Any, hidden_states: Any, bias_fn: Callable, mode: str):
    import torch
    import torch.nn.functional as F

    hidden_states = hidden_states.view(-1, module.hidden_dim)
    logits = F.linear(hidden_states.type(torch.float32), module.weight.type(torch.float32))
    biased = logits + bias_fn(logits)
    scores = biased.sigmoid()
    scores_for_choice = scores + module.e_score_correction_bias
    group_scores = (scores_for_choice.view(-1, module.num_group, module.num_experts // module.num_group)
                    .topk(2, dim=-1)[0].sum(dim=-1))
    group_idx = torch.topk(group_scores, k=module.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = (group_mask.unsqueeze(-1)
                  .expand(-1, module.num_group, module.num_experts // module.num_group)
                  .reshape(-1, module.num_experts))
    scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
    indices = torch.topk(scores_for_choice, k=module.top_k, dim=-1, sorted=False)[1]
    weights = (logits.sigmoid() if mode == "select" else scores).gather(1, indices)
    if module.norm_topk_prob:
        weights /= weights.sum(dim=-1, keepdim=True) + 1e-20
    weights = weights * module.routed_scaling_factor
    return biased, weights, indices


FAMILIES: dict[str, Callable] = {
    "mixtral": _softmax_family(always_norm=True, fp32_via_cast=True, cast_back=False),
    "qwen2_moe": _softmax_family(always_norm=False, fp32_via_cast=False, cast_back=True),
    "qwen3_moe": _softmax_family(always_norm=False, fp32_via_cast=False, cast_back=True),
    "olmoe": _softmax_family(always_norm=False, fp32_via_cast=False, cast_back=True),
    "gpt_oss": _gpt_oss,
    "deepseek_v3": _deepseek_v3,
}


def supported_model_types() -> list[str]:
    return sorted(FAMILIES)


def router_sites(model: Any) -> tuple[str, list[RouterSite]]:
    """(model_type, routers in layer order); InputError for an unsupported family."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in FAMILIES:
        raise InputError(f"model type {model_type!r}: cost-aware routing supports "
                         f"{', '.join(supported_model_types())}")
    return model_type, find_routers(model)


# --------------------------------------------------------------------------- the hook

class CostRoutingHook:
    """Add `S G^(l)` to every router's logits before its top-k (CAMoE eq. 13).

        with CostRoutingHook(model, tables.at(0.1)) as hook:   # float32[L, G, E]
            hook.set_sources(home_of_rows)                      # int[batch * seq]
            model(input_ids=...)

    tables: float[L, G, E] (L = the model's MoE layers in order, E its routed experts) or None
    (no bias). `set_table` swaps the table between forwards (the lambda controller does).
    """

    def __init__(self, model: Any, tables: np.ndarray | None, mode: str = "logits",
                 passthrough_at_zero: bool = True):
        check_choice("--mode", mode, BIAS_MODES)
        self.model = model
        self.model_type, self.sites = router_sites(model)
        self.route = FAMILIES[self.model_type]
        self.mode = mode
        self.passthrough_at_zero = passthrough_at_zero
        self._sources: Any = None
        self._saved: list[tuple[Any, bool, Any]] = []
        self._tables: list[Any] = []
        self._zero = True
        self.num_devices = 1
        self.set_table(tables)

    # -- configuration ------------------------------------------------------------------
    def set_table(self, tables: np.ndarray | None) -> None:
        """tables: float[L, G, E] or None; validated against the model's routers."""
        import torch

        L = len(self.sites)
        E = int(self.sites[0].module.num_experts)
        if tables is None:
            self._tables = [None] * L
            self._zero = True
            return
        t = np.asarray(tables, dtype=np.float32)
        if t.ndim != 3 or t.shape[0] != L or t.shape[2] != E:
            raise InputError(f"gate-bias tables {list(t.shape)} do not fit the model: "
                             f"{L} MoE layers x devices x {E} experts expected")
        if not np.isfinite(t).all():
            raise InputError("gate-bias tables hold a non-finite value")
        self.num_devices = int(t.shape[1])
        self._tables = [torch.from_numpy(np.ascontiguousarray(t[l])) for l in range(L)]
        self._zero = not bool(np.any(t))

    def set_sources(self, sources: Sequence[int] | np.ndarray | Any | None) -> None:
        """int[rows]: the home device of each flattened token row of the next forward(s)."""
        import torch

        if sources is None:
            self._sources = None
            return
        s = torch.as_tensor(np.asarray(sources), dtype=torch.long).reshape(-1)
        limit = self.num_devices if self._tables and self._tables[0] is not None else None
        if s.numel() and (int(s.min()) < 0 or (limit is not None and int(s.max()) >= limit)):
            raise InputError(f"token homes must lie in [0, {limit or 'G'}), got "
                             f"{int(s.min())}..{int(s.max())}")
        self._sources = s

    # -- context manager ----------------------------------------------------------------
    def __enter__(self) -> "CostRoutingHook":
        if self._saved:
            raise RuntimeError("CostRoutingHook is already active")
        try:
            for l, site in enumerate(self.sites):
                m = site.module
                had = "forward" in m.__dict__
                self._saved.append((m, had, m.__dict__.get("forward")))
                original = m.__dict__["forward"] if had else type(m).forward.__get__(m)
                m.forward = self._make_forward(l, m, original)
        except BaseException:
            self.restore()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()

    def restore(self) -> None:
        """Put every router's forward back as it was (idempotent)."""
        for m, had, fwd in reversed(self._saved):
            if had:
                m.forward = fwd
            else:
                m.__dict__.pop("forward", None)
        self._saved.clear()

    # -- the biased forward ---------------------------------------------------------------
    def _bias_fn(self, l: int) -> Callable:
        import torch

        def bias(logits):
            table = self._tables[l]
            rows = logits.reshape(-1, logits.shape[-1]).shape[0]
            if table is None:
                return torch.zeros_like(logits)
            if self._sources is None:
                src = torch.arange(rows) % table.shape[0]
            else:
                src = self._sources
                if src.numel() != rows:
                    raise RuntimeError(f"{self.sites[l].name}: {rows} token rows but "
                                       f"set_sources gave {src.numel()} homes")
            return table.to(logits.device)[src.to(logits.device)].to(logits.dtype).reshape(logits.shape)

        return bias

    def _make_forward(self, l: int, module: Any, original: Callable) -> Callable:
        route, bias_fn = self.route, self._bias_fn(l)

        def forward(hidden_states):
            if self._zero and self.passthrough_at_zero:
                return original(hidden_states)
            return route(module, hidden_states, bias_fn, self.mode)

        return forward
