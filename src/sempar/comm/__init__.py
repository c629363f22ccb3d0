"""Communication model (docs/design.md, comm/): topologies with alpha-beta links, the collectives of
each pipeline, and the all-to-all time simulator behind `sempar simulate`."""

from sempar.comm.topology import PHASES, Topology  # noqa: F401
from sempar.comm.topology_presets import TOPOLOGIES, load_topology, topology_preset  # noqa: F401
