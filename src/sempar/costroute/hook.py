"""Apply cost-aware gate bias to a Hugging Face MoE model's routers (CAMoE §3.4, eq. 13).

`CostRoutingHook` is a context manager. On entry it replaces the `forward` of every router
module found by `sempar.trace.routers.find_routers` (an instance attribute shadowing the class
method); on exit it removes it again, so the model is exactly as before (also when the forward
raised). Inside, each router computes its logits Z exactly as transformers does, adds row
`home[i]` of its layer's table (`S G^(l)`, float32[G, E] cast to the logits' dtype) and then
selects the top-k with the family's own rule (`sempar.families`: its `logits` and `topk`, copied
from transformers 5.x, the same rule exact pre-routing uses): no retraining, no change to
parameters or FLOPs.

`mode="logits"` (CAMoE: Z' replaces Z, so the bias moves both the choice and the mixing
weights) or `mode="select"` (ours, like DeepSeek-V3's correction bias: Z' chooses the experts,
the weights are the unbiased ones at the chosen experts, renormalised the family's way). The
router's first output (`router_logits`, used only for the auxiliary loss) is Z'.

With a zero table (lambda = 0) the router's own forward runs (`passthrough_at_zero`), so the
model's outputs are bit-identical; with `passthrough_at_zero=False` the re-implementation runs
and is bit-identical too (tested), which checks it against transformers.

Token homes (`S`, the source device of each row of the flattened [batch * seq, hidden] router
input) are given per forward with `set_sources(int[rows])`; when none is given, row i is on
device i mod G (docs/design.md's vanilla position split).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from sempar.errors import InputError, check_choice
from sempar.families import FAMILIES, Family, supporting
from sempar.trace.routers import RouterSite, find_routers

BIAS_MODES = ("logits", "select")


# --------------------------------------------------------------------------- biased routing

def route(fam: Family, module: Any, hidden_states: Any, bias_fn: Callable, mode: str):
    """One router's forward with the gate bias: Z as the family computes it, Z' = Z + bias, then
    the family's own top-k rule on Z' (weights from Z at the chosen experts in `select` mode).
    Returns (Z', weights float[T, k], indices int64[T, k]) like the router module."""
    logits = fam.logits(module, hidden_states)
    biased = logits + bias_fn(logits)
    weights, indices = fam.topk(module, biased, logits if mode == "select" else None)
    return biased, weights, indices


def supported_model_types() -> list[str]:
    return supporting("cost_routing")


def router_sites(model: Any) -> tuple[str, list[RouterSite]]:
    """(model_type, routers in layer order); InputError for an unsupported family."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in supported_model_types():
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
        self.family = FAMILIES[self.model_type]
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
        fam, bias_fn = self.family, self._bias_fn(l)

        def forward(hidden_states):
            if self._zero and self.passthrough_at_zero:
                return original(hidden_states)
            return route(fam, module, hidden_states, bias_fn, self.mode)

        return forward
