"""`RoutingTrace`: the routing of every token of a workload through every MoE layer (docs/design.md).

In memory a trace is a set of aligned numpy arrays, one row per token:

- `token_id`:   int32[T]        vocabulary id of the token
- `request_id`: int32[T]        the request (prompt or document) the token belongs to
- `position`:   int32[T]        position of the token inside its request
- `domain`:     int16[T]        index into `domains` (-1 = unknown), or None when no row has one
- `experts`:    uint8[T, L, k]  logical routed-expert ids selected at each MoE layer, listed by
                                 decreasing router weight (slot 0 is the top-1 choice; not when
                                 `TraceMeta.slots_sorted` is False); the dtype
                                 is `TraceMeta.expert_dtype`: uint8 up to 256 experts, int16 up
                                 to 32767, int32 above (files store int16 / int32, trace/io.py).
                                 Arithmetic on ids must widen first (`np.intp`): a uint8 id
                                 times N or plus a Python int wraps around.
- `weights`:    float32[T, L, k] optional router weights of those selections
- `decode`:     bool[T]         optional: True for a decode step (a generated token forwarded),
                                 False for a prefill row (a prompt token); None when the source
                                 did not say (older traces, synth, record). `sempar capture`
                                 and the routed-response importers set it.

and a `TraceMeta` with the model's shape. Shared experts are recorded in the metadata only:
every token uses them on its home device, so they never cross a link.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sempar.bounds import EXPERTS_MAX, VOCAB_MAX
from sempar.errors import InputError
from sempar.trace.layout import check_layer_ids, check_model_type, check_num_hidden_layers

# On-disk format (trace/io.py): version 2 stores `experts` and `weights` as fixed-size binary
# rows (L x k little-endian int16 / int32 ids, L x k float32 weights per row), which Parquet
# decodes as one buffer; version 1 as fixed-size lists, read still (committed traces, files
# in the wild). Version 3 is version 2 whose metadata block must carry a SHA-256 checksum
# (io.SUM_KEY); 1 and 2 predate the checksum and are read without one. All are written with
# `TraceWriter(format_version=...)`.
FORMAT_VERSION = 3
SUPPORTED_VERSIONS = (1, 2, 3)

# Shapes far beyond any real MoE (DeepSeek-V3: 61 layers, 256 experts, top-8, 129k vocabulary)
# and far below what a reader would exhaust memory on: a file claiming more is refused.
# Layer ids and num_hidden_layers are bounded like `--num-hidden-layers` (trace/layout.py).
SHAPE_LIMITS = {"num_layers": 4096, "num_experts": EXPERTS_MAX, "top_k": 1024,
                "vocab_size": VOCAB_MAX, "shared_experts": 1024, "num_expert_groups": EXPERTS_MAX,
                "topk_groups": EXPERTS_MAX}


@dataclass(frozen=True)
class TraceMeta:
    """Shape of the model that produced a trace.

    `num_expert_groups` / `topk_groups` describe group-limited routing (DeepSeek-V3: 8 groups,
    at most 4 of them per token); 1 / 1 means no group limit. `layer_ids` names the model's MoE
    layers the trace's L columns stand for (default 0..L-1). `num_hidden_layers` is the model's
    decoder-layer count, dense layers included (None: unknown), and `model_type` its HF
    `config.model_type` (None: unknown): together with `layer_ids` they say which of the model's
    layers are dense, which an engine file indexed by layer number needs. `has_token_ids` False
    says the source kept no token ids (`sempar import arrays` without them): the `token_id`
    column is then all zeros and means nothing, and every method that needs a token -> expert
    table refuses the trace (`require_token_ids`); files without the field read as True.
    `slots_sorted` False says slot 0 need not be the top-1 expert: the engine's top-k order
    was kept (SGLang's and vLLM's grouped / biased top-k take `torch.topk(..., sorted=False)`;
    `sempar capture` and the engine importers set it False), so every figure that reads slot
    order (top-1 look-back, top-1 ties) honours it or refuses (`require_sorted_slots`); files
    without it read as True.
    `extra` keeps free-form provenance (generator parameters, recorder settings).
    """

    model: str
    num_layers: int
    num_experts: int
    top_k: int
    vocab_size: int
    shared_experts: int = 0
    num_expert_groups: int = 1
    topk_groups: int = 1
    layer_ids: tuple[int, ...] | None = None
    num_hidden_layers: int | None = None
    model_type: str | None = None
    has_token_ids: bool = True
    slots_sorted: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise InputError(f"metadata.model: {self.model!r} is not a model name")
        for name in ("num_layers", "num_experts", "top_k", "vocab_size", "shared_experts",
                     "num_expert_groups", "topk_groups"):
            value = getattr(self, name)
            if name == "shared_experts" and isinstance(value, (int, np.integer)) and value < 0:
                raise InputError(f"metadata.shared_experts: {value!r} is negative")
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or \
                    value < (0 if name == "shared_experts" else 1):
                raise InputError(f"metadata.{name}: {value!r} is not a positive integer")
            if value > SHAPE_LIMITS[name]:
                raise InputError(f"metadata.{name}: {value} is above the limit {SHAPE_LIMITS[name]}")
        if self.num_layers * self.top_k > SHAPE_LIMITS["num_layers"] * 8:
            raise InputError(f"metadata: num_layers x top_k = {self.num_layers * self.top_k} "
                             f"expert ids per token is above the limit "
                             f"{SHAPE_LIMITS['num_layers'] * 8}")
        if self.top_k > self.num_experts:
            raise InputError(f"metadata.top_k: {self.top_k} exceeds num_experts {self.num_experts}")
        if self.shared_experts < 0:
            raise InputError(f"metadata.shared_experts: {self.shared_experts!r} is negative")
        if self.num_expert_groups < 1 or self.num_experts % self.num_expert_groups:
            raise InputError(
                f"metadata.num_expert_groups: {self.num_expert_groups!r} does not divide "
                f"num_experts {self.num_experts}")
        if not 1 <= self.topk_groups <= self.num_expert_groups:
            raise InputError(f"metadata.topk_groups: {self.topk_groups!r} is not in "
                             f"[1, {self.num_expert_groups}]")
        if not isinstance(self.has_token_ids, (bool, np.bool_)):
            raise InputError(f"metadata.has_token_ids: {self.has_token_ids!r} is not true or false")
        object.__setattr__(self, "has_token_ids", bool(self.has_token_ids))
        if not isinstance(self.slots_sorted, (bool, np.bool_)):
            raise InputError(f"metadata.slots_sorted: {self.slots_sorted!r} is not true or false")
        object.__setattr__(self, "slots_sorted", bool(self.slots_sorted))
        if self.layer_ids is not None:
            object.__setattr__(self, "layer_ids", check_layer_ids(
                "metadata.layer_ids", self.layer_ids, self.num_layers))
        if self.num_hidden_layers is not None:
            n = check_num_hidden_layers("metadata.num_hidden_layers", self.num_hidden_layers,
                                        self.layers)
            if self.layer_ids is None and n != self.num_layers:
                raise InputError(f"metadata.num_hidden_layers: {n} layers but no layer_ids say "
                                 f"which {self.num_layers} of them are MoE layers")
            object.__setattr__(self, "num_hidden_layers", n)
        check_model_type("metadata.model_type", self.model_type)
        if not isinstance(self.extra, dict):
            raise InputError(f"metadata.extra: {type(self.extra).__name__} is not an object")

    @property
    def layers(self) -> tuple[int, ...]:
        return self.layer_ids if self.layer_ids is not None else tuple(range(self.num_layers))

    @property
    def expert_dtype(self) -> np.dtype:
        """The in-memory dtype of expert ids: the narrowest of uint8 / int16 / int32 that holds
        0..num_experts-1 (a 2M-token DeepSeek-V3 trace is 0.93 GB in uint8, 1.86 GB in int16)."""
        if self.num_experts <= 1 << 8:
            return np.dtype(np.uint8)
        return self.stored_dtype

    @property
    def stored_dtype(self) -> np.dtype:
        """The dtype of expert ids in a trace file (both formats): int16, int32 when
        num_experts > 32767."""
        return np.dtype(np.int16) if self.num_experts <= np.iinfo(np.int16).max else np.dtype(np.int32)

    def layout(self) -> dict[str, Any]:
        """The model facts a placement solved on this trace carries (`Placement.info`): MoE
        `layer_ids`, `num_expert_groups`, and `num_hidden_layers` / `model_type` when known."""
        d: dict[str, Any] = {"layer_ids": list(self.layers), "num_expert_groups": self.num_expert_groups}
        if self.num_hidden_layers is not None:
            d["num_hidden_layers"] = int(self.num_hidden_layers)
        if self.model_type is not None:
            d["model_type"] = self.model_type
        return d

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["layer_ids"] = list(self.layer_ids) if self.layer_ids is not None else None
        if self.has_token_ids:      # written only when False: traces with ids keep their bytes
            del d["has_token_ids"]
        if self.slots_sorted:       # likewise
            del d["slots_sorted"]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "TraceMeta":
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [n for n in ("model", "num_layers", "num_experts", "top_k", "vocab_size") if n not in d]
        if missing:
            raise InputError(f"metadata: missing field {missing[0]!r}")
        kwargs = {k: v for k, v in d.items() if k in names}
        return cls(**kwargs)        # __post_init__ checks every field's type and range

    def first_difference(self, other: "TraceMeta") -> str | None:
        """The first model-shape field in which the two differ (their traces cannot be
        concatenated nor evaluated against each other); None when the shapes match."""
        for name in ("num_layers", "num_experts", "top_k", "shared_experts", "layer_ids",
                     "vocab_size", "num_expert_groups", "topk_groups"):
            if getattr(self, name) != getattr(other, name):
                return name
        return None

    def model_difference(self, other: "TraceMeta") -> str | None:
        """The first field saying the two come from different models: the model's name, its
        HF `model_type` when both know it, or a shape field (`first_difference`); None when
        they may be the same model. Shards and windows of one model must agree on all."""
        if self.model != other.model:
            return "model"
        if None not in (self.model_type, other.model_type) and self.model_type != other.model_type:
            return "model_type"
        return self.first_difference(other)


@dataclass
class RoutingTrace:
    """Per-token routing of a workload; see the module docstring for the arrays' shapes."""

    meta: TraceMeta
    token_id: np.ndarray
    request_id: np.ndarray
    position: np.ndarray
    experts: np.ndarray
    domain: np.ndarray | None = None
    domains: list[str] = field(default_factory=list)
    weights: np.ndarray | None = None
    decode: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.token_id.shape[0])

    @property
    def num_requests(self) -> int:
        return int(np.unique(self.request_id).size)

    def domain_names(self) -> np.ndarray:
        """object[T]: each row's domain name, or None."""
        names = np.array(list(self.domains) + [None], dtype=object)
        if self.domain is None:
            return np.full(self.num_tokens, None, dtype=object)
        return names[np.where(self.domain < 0, len(self.domains), self.domain)]

    def domain_counts(self) -> dict[str, int]:
        if self.domain is None:
            return {}
        counts = np.bincount(self.domain[self.domain >= 0], minlength=len(self.domains))
        return {name: int(c) for name, c in zip(self.domains, counts)}

    def take(self, rows: np.ndarray) -> "RoutingTrace":
        """A new trace holding `rows` (int index or bool mask over tokens), in that order."""
        return RoutingTrace(
            meta=self.meta,
            token_id=self.token_id[rows],
            request_id=self.request_id[rows],
            position=self.position[rows],
            experts=self.experts[rows],
            domain=None if self.domain is None else self.domain[rows],
            domains=list(self.domains),
            weights=None if self.weights is None else self.weights[rows],
            decode=None if self.decode is None else self.decode[rows],
        )

    def validate(self) -> "RoutingTrace":
        """Check every invariant; raise `InputError` naming field, row and value. Returns self."""
        from sempar.trace.validate import check_decode, validate_arrays   # validate reads TraceMeta

        validate_arrays(self.meta, self.token_id, self.request_id, self.position, self.experts,
                        self.domain, self.domains, self.weights)
        check_decode(self.decode, self.num_tokens)
        return self

    def info(self) -> dict[str, Any]:
        """The `trace info --json` contract."""
        return {
            "tokens": self.num_tokens,
            "requests": self.num_requests,
            "layers": self.meta.num_layers,
            "experts": self.meta.num_experts,
            "top_k": self.meta.top_k,
            "domains": self.domain_counts(),
            "model": self.meta.model,
            "shared_experts": self.meta.shared_experts,
            "vocab_size": self.meta.vocab_size,
            "has_weights": self.weights is not None,
            "has_token_ids": self.meta.has_token_ids,
            "slots_sorted": self.meta.slots_sorted,
        }


def require_token_ids(meta: TraceMeta, what: str, hint: str = "") -> None:
    """Bad input when the trace of `meta` has no token ids and `what` (a method, a figure)
    needs them: every token -> expert table would hold one meaningless token."""
    if not meta.has_token_ids:
        raise InputError(f"{what} needs token ids (a token -> expert table), and the trace of "
                         f"{meta.model} has none (imported without them){hint}")


def require_sorted_slots(meta: TraceMeta, what: str) -> None:
    """Bad input when `what` reads slot 0 as the top-1 expert and the trace's slots are in an
    engine's unsorted top-k order (`TraceMeta.slots_sorted` False)."""
    if not meta.slots_sorted:
        raise InputError(f"{what} reads slot 0 as the top-1 expert, and the trace of "
                         f"{meta.model} keeps its engine's unsorted top-k order "
                         "(metadata.slots_sorted false: captured from SGLang / vLLM)")
