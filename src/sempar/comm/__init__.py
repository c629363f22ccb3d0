"""Communication model (design.md, comm/): topologies with alpha-beta links, the collectives of
each pipeline, and the all-to-all time simulator behind `sempar simulate`."""

from sempar.comm.topology import (PHASES, TOPOLOGIES, Topology, load_topology,  # noqa: F401
                                  topology_preset)
