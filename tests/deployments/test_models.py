"""A GPU specification's floor follows its version's share of the traffic split: minInstances
in proportion, rounded up, at least one while minInstances is; the autoscaler's target is kept
within [floor, maxInstances]."""

from __future__ import annotations

import pytest

from service.deployments.models import DeploymentSpec


@pytest.mark.parametrize(
    ("minimum", "share", "floor"),
    [
        (4, 100, 4),
        (4, 75, 3),
        (4, 25, 1),
        (4, 5, 1),
        (4, 0, 1),
        (10, 5, 1),
        (10, 55, 6),
        (0, 50, 0),
    ],
)
def test_the_floor_is_minimum_instances_in_proportion_to_the_share(
    minimum: int, share: int, floor: int
) -> None:
    spec = DeploymentSpec(min_instances=minimum, max_instances=10, traffic_share=share, held=False)
    assert spec.floor_instances == floor
    assert spec.desired_instances == floor  # no target yet: the floor
    spec.target_instances = 8
    assert spec.desired_instances == 8
    spec.target_instances = 0
    assert spec.desired_instances == floor
