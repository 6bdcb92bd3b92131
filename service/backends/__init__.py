"""Backend adapters: the interface the reconciler drives, and the simulated cluster."""

from service.backends.protocol import (
    AdapterError,
    BackendAdapter,
    Capacity,
    InstanceSpec,
    NodeShape,
    ShapeCapacity,
)
from service.backends.simulated.adapter import SimulatedAdapter
from service.backends.simulated.model import SimulationDelays

__all__ = [
    "AdapterError",
    "BackendAdapter",
    "Capacity",
    "InstanceSpec",
    "NodeShape",
    "ShapeCapacity",
    "SimulatedAdapter",
    "SimulationDelays",
]
