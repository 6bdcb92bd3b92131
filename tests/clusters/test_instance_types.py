"""Instance type syntax, canonical form, descriptions and the offered-types generator."""

from __future__ import annotations

import pytest

from service.charts.mutate import instance_type_base
from service.clusters.instance_types import (
    CSPS,
    EXPECTED_SHAPE,
    InstanceType,
    InstanceTypeError,
    offered_instance_types,
    parse_instance_type,
    shape_offers,
)
from service.core.kube import instance_type_label


@pytest.mark.parametrize(
    ("value", "csp", "gpu", "per_node", "nodes", "label"),
    [
        ("DGXC.GPU.L40S_1x", "DGXC", "L40S", 1, 1, "DGXC.GPU.L40S"),
        ("ON-PREM.GPU.B200_8x.x2", "ON-PREM", "B200", 8, 2, "ON-PREM.GPU.B200"),
        ("NCP.GPU.H100_1x", "NCP", "H100", 1, 1, "NCP.GPU.H100"),
        ("DGXC.GPU.L40_1x", "DGXC", "L40", 1, 1, "DGXC.GPU.L40"),
        ("GCP.GPU.A100_80GB_2x", "GCP", "A100_80GB", 2, 1, "GCP.GPU.A100_80GB"),
        ("AWS.GPU.GB200_4x.x18", "AWS", "GB200", 4, 18, "AWS.GPU.GB200"),
        ("DGX-CLOUD.GPU.H100_8x", "DGX-CLOUD", "H100", 8, 1, "DGX-CLOUD.GPU.H100"),
        ("OCI.GPU.A10_1x", "OCI", "A10", 1, 1, "OCI.GPU.A10"),
        ("AZURE.GPU.H200_8x", "AZURE", "H200", 8, 1, "AZURE.GPU.H200"),
    ],
)
def test_documented_and_typical_types_parse(
    value: str, csp: str, gpu: str, per_node: int, nodes: int, label: str
) -> None:
    it = parse_instance_type(value)
    assert (it.csp, it.gpu, it.gpus_per_node, it.nodes) == (csp, gpu, per_node, nodes)
    assert it.name == str(it) == value
    assert it.is_multi_node is (nodes > 1)
    # the node label the simulated nodes carry and the affinity the mutations write agree
    assert instance_type_label(it.csp, it.gpu) == instance_type_base(value) == label


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        ("dgxc.gpu.l40s_1x", "DGXC.GPU.L40S_1x"),
        ("On-Prem.Gpu.b200_8X.X2", "ON-PREM.GPU.B200_8x.x2"),
        ("ncp.GPU.H100_08x", "NCP.GPU.H100_8x"),
    ],
)
def test_any_case_is_accepted_and_written_canonically(value: str, canonical: str) -> None:
    assert parse_instance_type(value).name == canonical


def test_equal_types_compare_equal_whatever_the_spelling() -> None:
    assert parse_instance_type("dgxc.gpu.l40s_1x") == parse_instance_type("DGXC.GPU.L40S_1x")
    assert InstanceType.of("DGXC", "L40S", 1) == parse_instance_type("DGXC.GPU.L40S_1x")
    assert InstanceType.of("ON-PREM", "B200", 8, 2).name == "ON-PREM.GPU.B200_8x.x2"


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ("", "it is empty"),
        ("DGXC.GPU.L40S_1x ", "it must not contain whitespace"),
        ("DGXC.L40S_1x", "'.GPU.' must follow the CSP"),
        ("DGXC.CPU.L40S_1x", "'.GPU.' must follow the CSP"),
        ("L40S_1x", "'.GPU.' must follow the CSP"),
        ("gl40_1.br20_2xlarge", "'.GPU.' must follow the CSP"),
        ("DGXC.GPU.L40S_1x.x2.x3", "too many '.'-separated parts (5, at most 4)"),
        ("MARS.GPU.L40S_1x", f"unknown CSP 'MARS' (allowed: {', '.join(CSPS)})"),
        (".GPU.L40S_1x", "the CSP is missing"),
        ("DGXC.GPU.L40S", "'L40S' lacks the '_<N>x' GPU count suffix (e.g. 'L40S_1x')"),
        ("DGXC.GPU._1x", "the GPU name is missing before '_<N>x'"),
        ("DGXC.GPU.L40-S_1x", "GPU name 'L40-S' may contain only letters, digits and '_'"),
        ("DGXC.GPU.L40S_1", "GPU count '1' must end with 'x' (e.g. '_1x')"),
        ("DGXC.GPU.L40S_", "GPU count '' must end with 'x' (e.g. '_1x')"),
        ("DGXC.GPU.L40S_0x", "GPUs per node '0' is not a positive integer"),
        ("DGXC.GPU.L40S_x", "GPUs per node '' is not a positive integer"),
        ("DGXC.GPU.L40S_-1x", "GPUs per node '-1' is not a positive integer"),
        ("DGXC.GPU.L40S_twox", "GPUs per node 'two' is not a positive integer"),
        ("DGXC.GPU.L40S_²x", "GPUs per node '²' is not a positive integer"),
        (
            "DGXC.GPU.L40S_" + "9" * 4301 + "x",
            f"GPUs per node '{'9' * 20}' is not a positive integer",
        ),
        ("DGXC.GPU.L40S_12345x", "GPUs per node '12345' is not a positive integer"),
        ("ON-PREM.GPU.B200_8x.x²", "node count 'x²' must be 'x<NODES>' with an integer, e.g. 'x2'"),
        (
            "ON-PREM.GPU.B200_8x.x1",
            "node count 'x1' must be at least 2 (omit '.x<NODES>' for a single node)",
        ),
        (
            "ON-PREM.GPU.B200_8x.x0",
            "node count 'x0' must be at least 2 (omit '.x<NODES>' for a single node)",
        ),
        (
            "ON-PREM.GPU.B200_8x.2",
            "node count '2' must be 'x<NODES>' with an integer, e.g. 'x2'",
        ),
        (
            "ON-PREM.GPU.B200_8x.xtwo",
            "node count 'xtwo' must be 'x<NODES>' with an integer, e.g. 'x2'",
        ),
    ],
)
def test_malformed_types_say_what_is_wrong(value: str, what: str) -> None:
    with pytest.raises(InstanceTypeError) as caught:
        parse_instance_type(value)
    assert str(caught.value) == f"{value!r} is not a valid instance type: {what}; {EXPECTED_SHAPE}"


def test_every_problem_of_a_malformed_type_is_reported_together() -> None:
    with pytest.raises(InstanceTypeError) as caught:
        parse_instance_type("FOO.GPU.H-1_0x.x1")
    assert caught.value.problems == [
        f"unknown CSP 'FOO' (allowed: {', '.join(CSPS)})",
        "GPU name 'H-1' may contain only letters, digits and '_'",
        "GPUs per node '0' is not a positive integer",
        "node count 'x1' must be at least 2 (omit '.x<NODES>' for a single node)",
    ]


def test_the_expected_shape_is_shown_with_examples() -> None:
    assert EXPECTED_SHAPE == (
        "expected <CSP>.GPU.<GPU_NAME>_<N>x[.x<NODES>], "
        "e.g. DGXC.GPU.L40S_1x or ON-PREM.GPU.B200_8x.x2"
    )


@pytest.mark.parametrize(
    ("value", "description"),
    [
        ("DGXC.GPU.L40S_1x", "1x L40S GPU"),
        ("NCP.GPU.H100_8x", "8x H100 GPUs"),
        ("ON-PREM.GPU.B200_8x.x2", "2 nodes x 8x B200 GPUs"),
        ("DGXC.GPU.L40_1x.x3", "3 nodes x 1x L40 GPU"),
    ],
)
def test_descriptions(value: str, description: str) -> None:
    assert parse_instance_type(value).description == description


def _names(types: list[InstanceType]) -> list[str]:
    return [t.name for t in types]


@pytest.mark.parametrize(
    ("gpus", "count", "suffixes"),
    [
        (1, 1, ["_1x"]),
        (1, 4, ["_1x", "_1x.x2", "_1x.x3", "_1x.x4"]),
        (2, 1, ["_1x", "_2x"]),
        (4, 1, ["_1x", "_2x", "_4x"]),
        (8, 1, ["_1x", "_2x", "_4x", "_8x"]),
        (8, 2, ["_1x", "_2x", "_4x", "_8x", "_8x.x2"]),
        (8, 3, ["_1x", "_2x", "_4x", "_8x", "_8x.x2", "_8x.x3"]),
        (6, 1, ["_1x", "_2x", "_4x", "_6x"]),
        (3, 2, ["_1x", "_2x", "_3x", "_3x.x2"]),
    ],
)
def test_offered_types_per_node_shape(gpus: int, count: int, suffixes: list[str]) -> None:
    offered = offered_instance_types("NCP", "H100", gpus, count)
    assert _names(offered) == [f"NCP.GPU.H100{s}" for s in suffixes]


@pytest.mark.parametrize(("gpus", "count"), [(1, 1), (1, 4), (3, 2), (6, 1), (8, 1), (8, 5)])
def test_a_shape_offers_exactly_the_types_it_lists(gpus: int, count: int) -> None:
    # the constant-time check a deploy uses agrees with the list, for every type nearby
    offered = set(_names(offered_instance_types("ncp", "h100", gpus, count)))
    candidates = [
        InstanceType.of(csp, gpu, per_node, nodes)
        for csp in ("NCP", "AWS")
        for gpu in ("H100", "L40S")
        for per_node in range(1, 10)
        for nodes in range(1, count + 3)
    ]
    for it in candidates:
        assert shape_offers("ncp", "h100", gpus, count, it) == (it.name in offered), it.name


def test_offered_types_refuse_empty_shapes() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        offered_instance_types("NCP", "H100", 0, 1)
    with pytest.raises(ValueError, match="must be positive"):
        offered_instance_types("NCP", "H100", 8, 0)
