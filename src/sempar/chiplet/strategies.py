"""The parallel strategies the simulator compares, by name (FSE-DP §VI-A baselines, §VI-C A1-A5).

| name | paper | engine |
| --- | --- | --- |
| `ep` | EP baseline as the paper runs it: one whole expert per die, load then compute | ep.py, contiguous placement |
| `ep-db` | ours: EP with whole-expert double buffering (a stronger baseline) | ep.py, `buffers=2` |
| `hydra` | Hydra [17], its EP expert relocation, on the paper's EP | ep.py + hydra.py |
| `hydra-db` | ours: Hydra on `ep-db` | ep.py + hydra.py, `buffers=2` |
| `fsedp-naive` | §III, A1 | naive.py |
| `fsedp` | §IV micro-slice flow, Rules 1-4, A2 | flow.py, id order |
| `fsedp+paired-load` | §IV-A, A3 | flow.py, hot/cold pairs |
| `fsedp+paired-load+rule5` | Rule 5, A4 | flow.py, roomiest die |
| `fsedp+paired-load+buffering{10,20,30}` | Alg. 2 slack, A5 = 20 | buffering.py + flow.py |

Short names are accepted too: `naive`, `+paired-load`, `+rule5`, `+buffering` (20%), `A1`..`A5`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sempar.errors import InputError
from sempar.registry import Registry


@dataclass(frozen=True)
class Strategy:
    name: str
    kind: str                     # "ep", "hydra", "naive" or "flow"
    paired: bool = False
    rule5: bool = False
    slack: float | None = None    # token buffering slack (Alg. 2), None = off
    ablation: str = ""
    double_buffer: bool = False   # EP / Hydra: two whole-expert buffers per die (ours)

    @property
    def knobs(self) -> tuple[str, ...]:
        """The options that change this strategy's result beyond the package and workload:
        only the FSE-DP flow streams experts in micro-slices (`--micro-slices`)."""
        return ("micro_slices",) if self.kind == "flow" else ()

    @property
    def label(self) -> str:
        return f"{self.name} ({self.ablation})" if self.ablation else self.name


STRATEGIES: Registry[Strategy] = Registry("strategy")
for _s in (
    Strategy("ep", "ep"),
    Strategy("ep-db", "ep", double_buffer=True),
    Strategy("hydra", "hydra"),
    Strategy("hydra-db", "hydra", double_buffer=True),
    Strategy("fsedp-naive", "naive", ablation="A1"),
    Strategy("fsedp", "flow", ablation="A2"),
    Strategy("fsedp+paired-load", "flow", paired=True, ablation="A3"),
    Strategy("fsedp+paired-load+rule5", "flow", paired=True, rule5=True, ablation="A4"),
    Strategy("fsedp+paired-load+buffering10", "flow", paired=True, slack=0.10),
    Strategy("fsedp+paired-load+buffering20", "flow", paired=True, slack=0.20, ablation="A5"),
    Strategy("fsedp+paired-load+buffering30", "flow", paired=True, slack=0.30),
):
    STRATEGIES.add(_s.name, _s)

ALIASES = {
    "naive": "fsedp-naive", "a1": "fsedp-naive", "a2": "fsedp", "a3": "fsedp+paired-load",
    "+paired-load": "fsedp+paired-load", "paired-load": "fsedp+paired-load",
    "a4": "fsedp+paired-load+rule5", "+rule5": "fsedp+paired-load+rule5",
    "a5": "fsedp+paired-load+buffering20", "+buffering": "fsedp+paired-load+buffering20",
}


def resolve(spec: str) -> list[Strategy]:
    """'all' or a comma-separated list of names/aliases -> strategies (registry order)."""
    if spec.strip().lower() == "all":
        return [STRATEGIES.get(n) for n in STRATEGIES.names()]
    out: list[Strategy] = []
    for part in spec.split(","):
        p = part.strip()
        if not p:
            continue
        name = ALIASES.get(p.lower(), p)
        s = STRATEGIES.get(name)
        if s not in out:
            out.append(s)
    if not out:
        raise InputError(f"--strategy: {spec!r} names no strategy")
    return out
