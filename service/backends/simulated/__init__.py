"""The `simulated` backend (runtime.md §4); see `service.backends.simulated.adapter`."""

from service.backends.simulated.adapter import (
    FAULTS,
    SimulatedAdapter,
    SimulationDelays,
)

__all__ = ["FAULTS", "SimulatedAdapter", "SimulationDelays"]
