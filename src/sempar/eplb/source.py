"""FILE of the engine-balancer policy: a sempar placement JSON or a `sempar stats build` file,
read with sempar's own readers, checked against the engine's model shape, cached by identity.

What the policy takes from FILE (`Source`):
- `affinity` float32[L, N, N]: how much each expert pair gains from sharing a device. A stats
  file: its co-activation counts (part "coactivation", rows selecting both experts; else the
  same counts from its row sample); a placement: 1 for every pair FILE put on one device (so
  keeping FILE's groups is what scores).
- `home(G, seed, layout)` int64[L, N]: each expert's device in the locality layout of G
  devices. A placement: the device of the expert's first slot
  (`placement.sempar.rows.first_copy_device`). A stats file: the layout named by
  `PluginConfig.layout` (`layout.LAYOUTS`: `sempar`, ours, sempar's rows-objective solver on
  FILE's sample rows; `metis`, the METIS baseline on the co-activation graph, also the fallback
  where `sempar` has no sample or fails), computed once per (FILE version, G, layout).
- `sample` int[S, L, k] (stats files with a sample): rows the reported LAR is measured on and
  the `sempar` layout is solved on; `requests` int64[S]: their requests (None: unknown).

`load_source` refuses with `SourceMismatch` (one line saying why) a FILE that is missing,
unreadable or corrupt (the readers' checksums), stale (`max_age_s`), of another model, or of
other layer / expert counts or (a placement) another EP size.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from sempar.errors import InputError


from sempar.eplb.layout import LAYOUTS, NEIGHBOURS, capped, metis_home, partition, sempar_home

__all__ = ["Source", "SourceMismatch", "load_source", "partition", "capped", "NEIGHBOURS"]


class SourceMismatch(Exception):
    """FILE cannot serve this rebalance; the message is the one line the plug-in logs."""


@dataclass
class Source:
    """A loaded FILE (module docstring). key: (inode, mtime_ns, size) it was read at."""

    kind: str                               # "placement" | "stats"
    path: str
    key: tuple
    model: str | None
    num_layers: int
    num_experts: int
    num_devices: int | None                 # a placement's EP size; None for stats
    affinity: np.ndarray                    # float32[L, N, N], zero diagonal
    base_home: np.ndarray | None = None     # int64[L, N] (placement)
    sample: np.ndarray | None = None        # int[S, L, k]
    requests: np.ndarray | None = None      # int64[S]: each sample row's request
    meta: object | None = None              # TraceMeta (stats): the `sempar` layout's model
    layout_effort: float = 1.0              # the `sempar` layout's work (`PluginConfig`)
    layout_rows: int = 4096
    _homes: dict = field(default_factory=dict)
    layouts: dict = field(default_factory=dict)   # (G, layout) -> (used, seconds, fallback)

    def home(self, G: int, seed: int = 0, layout: str = "sempar") -> np.ndarray:
        """int64[L, N]: each expert's device in FILE's locality layout of G devices (module
        docstring); `layouts[(G, layout)]` says which layout gave it, its seconds and, where
        `sempar` fell back to `metis`, why."""
        if self.base_home is not None:
            if G != self.num_devices:
                raise SourceMismatch(f"{self.path}: placement for EP {self.num_devices}, "
                                     f"the engine runs EP {G}")
            if G not in self._homes:         # a placement with more replicas than the engine
                self._homes[G] = np.stack([capped(self.base_home[l], self.affinity[l], G)
                                           for l in range(self.num_layers)])
            return self._homes[G]
        LAYOUTS.get(layout)                                  # unknown name: InputError
        key = (G, layout)
        if key not in self._homes:
            t0, why = time.perf_counter(), None
            home = None
            if layout == "sempar":
                if self.sample is None or self.meta is None:
                    why = "FILE has no sample rows"
                else:
                    try:
                        home = sempar_home(self.meta, self.sample, self.requests, G, seed,
                                           rows=self.layout_rows, effort=self.layout_effort,
                                           affinity=self.affinity)
                    except Exception as err:  # noqa: BLE001 - the METIS layout serves instead
                        why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            used = layout if home is not None else "metis"
            if home is None:
                home = metis_home(self.affinity, G, seed)
            self._homes[key] = home
            self.layouts[key] = (used, time.perf_counter() - t0, why)
        return self._homes[key]


def file_key(path: str) -> tuple:
    """(inode, mtime_ns, size) of FILE: a refresh written atomically (rename) changes it."""
    st = os.stat(path)
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _same_model(a: str, b: str) -> bool:
    """Model names match by their last path component, case-insensitive
    ("deepseek-ai/DeepSeek-V3" and "DeepSeek-V3" are one model)."""
    def norm(s: str) -> str:
        return s.rstrip("/").rsplit("/", 1)[-1].lower()
    return norm(a) == norm(b)


def _read(path: str, key: tuple, sample_rows: int, seed: int, layout: dict) -> Source:
    with open(path, "rb") as f:
        head = f.read(1)
    if head == b"{":
        return _from_placement(path, key)
    return _from_stats(path, key, sample_rows, seed, layout)


def _from_placement(path: str, key: tuple) -> Source:
    from sempar.placement.placement import Placement

    return source_from_placement(Placement.load(path), path, key)


def source_from_placement(p, path: str = "<placement>", key: tuple = ()) -> Source:
    """`Source` of a `Placement` in memory (`sempar replay` passes one; FILE goes through
    `load_source`)."""
    from sempar.placement.sempar.rows import first_copy_device

    home = first_copy_device(p)
    L, N, G = p.num_layers, p.num_experts, p.num_devices
    S = p.slots_per_device
    hosts = np.zeros((L, G, N), np.float32)
    dev = np.repeat(np.arange(G), S)
    for l in range(L):
        hosts[l, dev, p.phy2log[l]] = 1.0
    A = np.einsum("lgn,lgm->lnm", hosts, hosts)
    A = np.minimum(A, 1.0)
    idx = np.arange(N)
    A[:, idx, idx] = 0.0
    model = p.info.get("model") if isinstance(p.info.get("model"), str) else None
    return Source("placement", path, key, model, L, N, G, A, base_home=home)


def _from_stats(path: str, key: tuple, sample_rows: int, seed: int, layout: dict) -> Source:
    from sempar.stats.file import load_stats

    return source_from_stats(load_stats(path), path, key, sample_rows, seed, **layout)


def source_from_stats(st, path: str = "<stats>", key: tuple = (), sample_rows: int = 4096,
                      seed: int = 0, **layout) -> Source:
    """`Source` of a `RoutingStats` in memory (as `source_from_placement`); `layout`:
    `layout_effort` / `layout_rows` of the `sempar` layout (`PluginConfig`)."""
    L, N = st.meta.num_layers, st.meta.num_experts
    sample = requests = None
    if st.sample is not None and "experts" in st.sample and st.sample["experts"].shape[0]:
        sample = np.asarray(st.sample["experts"])
        if "request_id" in st.sample and len(st.sample["request_id"]) == sample.shape[0]:
            requests = np.asarray(st.sample["request_id"], np.int64)
        if sample_rows and sample.shape[0] > sample_rows:
            keep = np.sort(np.random.default_rng(seed).choice(sample.shape[0], sample_rows,
                                                              replace=False))
            sample = sample[keep]
            requests = None if requests is None else requests[keep]
    if st.coactivation is not None:
        A = np.asarray(st.coactivation, np.float32)
    elif st.sample is not None and "experts" in st.sample:
        ex = np.asarray(st.sample["experts"])
        A = np.zeros((L, N, N), np.float32)
        for l in range(L):                  # X^T X of the one-hot selections
            X = np.zeros((ex.shape[0], N), np.float32)
            np.put_along_axis(X, ex[:, l].astype(np.intp), 1.0, axis=1)
            A[l] = X.T @ X
    else:
        raise SourceMismatch(f"{path}: the stats file has neither the 'coactivation' nor the "
                             f"'sample' part; rebuild with `sempar stats build --parts "
                             f"sample,coactivation`")
    A = A.copy()
    idx = np.arange(N)
    A[:, idx, idx] = 0.0
    if not np.all(np.isfinite(A)) or A.min() < 0:
        raise SourceMismatch(f"{path}: co-activation counts are not finite and non-negative")
    return Source("stats", path, key, st.meta.model, L, N, None, A, sample=sample,
                  requests=requests, meta=st.meta, **layout)


_CACHE: dict[str, Source] = {}


def load_source(path: str, *, num_layers: int, num_experts: int, num_ranks: int,
                model: str | None = None, max_age_s: float | None = None,
                sample_rows: int = 4096, seed: int = 0, settle_s: float = 0.0,
                layout: dict | None = None) -> Source:
    """FILE checked against the engine's shape (module docstring). FILE is stat-ed on every
    call and read again only when its (inode, mtime, size) changed, so a refresh written
    atomically is picked up at the next rebalance and a half-written file is never seen.

    Every rank runs the policy on its own (both engines do, and expect the same map): a
    refresh younger than `settle_s` is not used yet while an older version is cached, so the
    ranks of one rebalance, seconds apart at most, switch versions together."""
    try:
        key = file_key(path)
    except OSError as err:
        raise SourceMismatch(f"{path}: cannot read ({err.strerror or err})") from None
    if max_age_s is not None:
        age = time.time() - key[1] / 1e9
        if age > max_age_s:
            raise SourceMismatch(f"{path}: stale, written {age:.0f} s ago "
                                 f"(SEMPAR_EPLB_MAX_AGE_S = {max_age_s:g})")
    src = _CACHE.get(path)
    if src is not None and src.key != key and settle_s and time.time() - key[1] / 1e9 < settle_s:
        key = src.key               # a fresh refresh: every rank switches once it settled
    if src is None or src.key != key:
        _CACHE.pop(path, None)
        try:
            src = _read(path, key, sample_rows, seed, layout or {})
        except InputError as err:
            raise SourceMismatch(str(err)) from None
        except (OSError, ValueError, KeyError, TypeError, MemoryError) as err:
            raise SourceMismatch(f"{path}: unreadable ({type(err).__name__}: "
                                 f"{str(err).splitlines()[0] if str(err) else ''})") from None
        _CACHE[path] = src
    if model and src.model and not _same_model(model, src.model):
        raise SourceMismatch(f"{path}: made for model {src.model}, the engine serves {model}")
    if src.num_layers != num_layers:
        raise SourceMismatch(f"{path}: {src.num_layers} MoE layers, the engine's model has "
                             f"{num_layers}")
    if src.num_experts != num_experts:
        raise SourceMismatch(f"{path}: {src.num_experts} experts per layer, the engine's model "
                             f"has {num_experts}")
    if src.num_devices is not None and src.num_devices != num_ranks:
        raise SourceMismatch(f"{path}: placement for EP {src.num_devices}, the engine runs "
                             f"EP {num_ranks}")
    return src
