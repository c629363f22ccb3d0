"""The serving systems `sempar serve-sim` compares, by name: each is a placement method, a
request policy (Attention-DP) or token scheduler (Attention-TP re-batching), a pipeline and a
number of redundant expert slots, all looked up by name in their registries (placement `SOLVERS`,
`REQUEST_POLICIES`, comm `PIPELINES`), so solvers and pipelines added later are usable at once.

| system | placement | homes | pipeline | source |
| --- | --- | --- | --- | --- |
| `sglang` | vanilla | DP, round-robin | sglang-ep (DeepEP) | Sem-MoE §5 baseline |
| `sglang-eplb` | eplb, G redundant slots | DP, round-robin | sglang-ep | SGLang's EPLB |
| `moetuner` | moetuner | DP, round-robin | sglang-ep | Sem-MoE §5 baseline |
| `semmoe-dp` | semmoe | DP, Alg. 2 | sglang-ep | Sem-MoE §3.2, App. B Alg. 2 |
| `ds-moe` | vanilla | TP, contiguous chunks | ds-moe | s-MoE §5 baseline |
| `semmoe-tp` | semmoe | TP, re-batching (Alg. 3) | semmoe-tp | Sem-MoE §3.2 |
| `smoe` | smoe-cem | TP, re-batching (SRS/SAG) | smoe | s-MoE §4, Alg. 2 |
| `exflow` | exflow | DP, round-robin, context-coherent | exflow | ExFlow §IV |
| `sempar` | sempar (else semmoe) | DP `balanced` / TP exact pre-routing | see below | ours |

`sempar` is ours and has variants: Attention-DP with the `balanced` policy on `sglang-ep`, and
Attention-TP on `smoe-exact` (exact pre-routing) when that pipeline is registered, else `smoe`.
`serve-sim` runs every variant and reports the better one under the E2E SLO (and names it). Its
placement is the `sempar` solver when registered, else `semmoe` (the notes say which).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sempar.registry import Registry


@dataclass(frozen=True)
class Variant:
    placement: str
    pipeline: str
    policy: str = "round-robin"
    schedule: str = "none"      # comm.homes schedules: none (vanilla homes), auto, online
    redundant: str = "0"        # slots per layer: an integer, or "G" (one per device)
    notes: tuple[str, ...] = ()

    def redundant_slots(self, G: int) -> int:
        return G if self.redundant == "G" else int(self.redundant)

    def label(self) -> str:
        return f"{self.placement}/{self.pipeline}/{self.policy}"


@dataclass(frozen=True)
class System:
    name: str
    description: str
    variants: tuple[Variant, ...] = field(default_factory=tuple)


SYSTEMS: Registry[System] = Registry("serving system")


def _first_registered(names: tuple[str, ...], registry) -> tuple[str, tuple[str, ...]]:
    for i, n in enumerate(names):
        if n in registry:
            note = () if i == 0 else (f"{names[0]} is not registered: {n} used instead",)
            return n, note
    return names[-1], ()


def resolve(name: str) -> System:
    """The system `name` with its variants resolved against the registries of this install."""
    return SYSTEMS.get(name)() if callable(SYSTEMS.get(name)) else SYSTEMS.get(name)


def _add(name: str, description: str, *variants: Variant) -> None:
    SYSTEMS.add(name, System(name, description, variants))


_add("sglang", "SGLang: attention DP, round-robin, vanilla placement, DeepEP dispatch",
     Variant("vanilla", "sglang-ep"))
_add("sglang-eplb", "SGLang with EPLB placement (G redundant slots)",
     Variant("eplb", "sglang-ep", redundant="G"))
_add("moetuner", "MoETuner ILP placement on SGLang's DP pipeline", Variant("moetuner", "sglang-ep"))
_add("semmoe-dp", "Sem-MoE attention DP: co-clustered placement + Alg. 2 request scheduling",
     Variant("semmoe", "sglang-ep", "alg2", "auto"))
# ds-moe before the other TP systems: with --systems all it is the TP baseline (forecast.py)
_add("ds-moe", "DeepSpeed-MoE: attention TP + EP, AR -> A2A -> A2A -> AG",
     Variant("vanilla", "ds-moe"))
_add("semmoe-tp", "Sem-MoE attention TP: co-clustered placement + token re-batching",
     Variant("semmoe", "semmoe-tp", "alg2", "auto"))
_add("smoe", "s-MoE: speculative expert grouping + token shuffling (SRS/SAG)",
     Variant("smoe-cem", "smoe", "alg2", "auto"))
_add("exflow", "ExFlow: context-coherent EP with affinity placement", Variant("exflow", "exflow"))


def _sempar() -> System:
    from sempar.comm.pipelines import PIPELINES
    from sempar.placement import SOLVERS

    place, n1 = _first_registered(("sempar", "semmoe"), SOLVERS)
    tp, n2 = _first_registered(("smoe-exact", "smoe"), PIPELINES)
    return System("sempar", "ours: best placement, balanced requests, exact pre-routing",
                  (Variant(place, "sglang-ep", "balanced", "online", notes=n1),
                   Variant(place, tp, "alg2", "online", notes=n1 + n2)))


SYSTEMS.add("sempar", _sempar)      # resolved late: other modules may register solvers first

DEFAULT_SYSTEMS = tuple(SYSTEMS.names())
