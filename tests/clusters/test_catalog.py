"""Cluster catalog: built-in offer, file loading with line-accurate problems, lookups, and
the deployment-specification resolver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.backends import SimulatedAdapter, SimulationDelays
from service.clusters.adapters import build_adapter
from service.clusters.catalog import (
    BUILTIN_SOURCE,
    Catalog,
    CatalogError,
    CatalogFile,
    ResolvedTarget,
    check_catalog,
    load_catalog,
    resolve_spec,
)
from service.clusters.instance_types import CSPS, EXPECTED_SHAPE, InstanceType, parse_instance_type
from service.core.errors import FieldError

DATA = Path(__file__).parent / "data"
SPEC = "deploymentSpecifications[0]"


@pytest.fixture(scope="module")
def builtin() -> Catalog:
    return load_catalog(None)


@pytest.fixture(scope="module")
def multi() -> Catalog:
    return load_catalog(DATA / "valid_catalog.yaml")


def _offered(catalog: Catalog, group: str, gpu: str) -> list[str]:
    return [o.instance_type.name for o in catalog.offerings(group, gpu)]


def _default(catalog: Catalog, group: str, gpu: str) -> InstanceType | None:
    """The offering marked default (what the resolver picks when a spec names no type)."""
    return next((o.instance_type for o in catalog.offerings(group, gpu) if o.default), None)


# --- the built-in catalog ---------------------------------------------------------------------


def test_builtin_catalog_has_the_documented_group_and_clusters(builtin: Catalog) -> None:
    assert builtin.source == BUILTIN_SOURCE
    assert [g.name for g in builtin.groups] == ["nvcf-default"]
    clusters = {c.name: c for c in builtin.groups[0].clusters}
    assert list(clusters) == ["sim-ncp", "sim-dgxc", "sim-onprem"]
    assert {c.adapter for c in clusters.values()} == {"simulated"}
    assert [(c.provider, c.attributes) for c in clusters.values()] == [
        ("NCP", []),
        ("DGXC", []),
        ("ON-PREM", ["NVLinkOptimized"]),
    ]
    shapes = {n: [(s.gpu, s.gpus_per_node, s.count) for s in c.nodes] for n, c in clusters.items()}
    assert shapes == {
        "sim-ncp": [("H100", 8, 2)],
        "sim-dgxc": [("L40S", 1, 4), ("L40", 1, 4)],
        "sim-onprem": [("B200", 8, 2)],
    }
    # Small delays so a fresh install deploys in about a second.
    assert all(c.simulation.ready_seconds <= 1 for c in clusters.values())


def test_builtin_catalog_offers_the_documented_examples(builtin: Catalog) -> None:
    assert builtin.gpus("nvcf-default") == ["H100", "L40S", "L40", "B200"]
    assert _offered(builtin, "nvcf-default", "H100") == [
        "NCP.GPU.H100_1x",
        "NCP.GPU.H100_2x",
        "NCP.GPU.H100_4x",
        "NCP.GPU.H100_8x",
        "NCP.GPU.H100_8x.x2",
    ]
    assert _offered(builtin, "nvcf-default", "l40s") == [
        "DGXC.GPU.L40S_1x",
        "DGXC.GPU.L40S_1x.x2",
        "DGXC.GPU.L40S_1x.x3",
        "DGXC.GPU.L40S_1x.x4",
    ]
    assert _offered(builtin, "nvcf-default", "L40")[0] == "DGXC.GPU.L40_1x"
    assert _offered(builtin, "nvcf-default", "B200")[-1] == "ON-PREM.GPU.B200_8x.x2"
    assert _default(builtin, "NVCF-DEFAULT", "L40") == parse_instance_type("DGXC.GPU.L40_1x")
    assert [str(_default(builtin, "nvcf-default", g)) for g in ("H100", "L40S", "B200")] == [
        "NCP.GPU.H100_1x",
        "DGXC.GPU.L40S_1x",
        "ON-PREM.GPU.B200_1x",
    ]


@pytest.mark.parametrize(
    ("spec", "is_helm", "instance_type", "cluster"),
    [
        ({"gpu": "H100", "instanceType": "NCP.GPU.H100_1x"}, False, "NCP.GPU.H100_1x", "sim-ncp"),
        (
            {"gpu": "L40S", "instanceType": "DGXC.GPU.L40S_1x"},
            False,
            "DGXC.GPU.L40S_1x",
            "sim-dgxc",
        ),
        ({"gpu": "L40", "backend": "nvcf-default"}, False, "DGXC.GPU.L40_1x", "sim-dgxc"),
        (
            {"gpu": "B200", "instanceType": "ON-PREM.GPU.B200_8x.x2"},
            True,
            "ON-PREM.GPU.B200_8x.x2",
            "sim-onprem",
        ),
    ],
)
def test_documented_examples_resolve_on_a_fresh_install(
    builtin: Catalog, spec: dict[str, Any], is_helm: bool, instance_type: str, cluster: str
) -> None:
    target = resolve_spec(builtin, spec, is_helm=is_helm)
    assert isinstance(target, ResolvedTarget)
    assert target.group.name == "nvcf-default"
    assert target.instance_type.name == instance_type
    assert [c.name for c in target.clusters] == [cluster]


def test_ids_are_stable_uuids_derived_from_names(builtin: Catalog) -> None:
    again = load_catalog(None)
    assert [g.id for g in again.groups] == [g.id for g in builtin.groups]
    assert [c.id for c in again.clusters] == [c.id for c in builtin.clusters]
    ids = {builtin.groups[0].id, *(c.id for c in builtin.clusters)}
    assert len(ids) == 4
    assert builtin.groups[0].id.version == 5


# --- lookups ----------------------------------------------------------------------------------


def test_lookups_are_case_insensitive(multi: Catalog) -> None:
    group = multi.group("EDGE")
    assert group is not None and group.name == "edge"
    assert multi.group("nope") is None
    cluster = multi.cluster("Prod-A")
    assert cluster is not None and cluster.name == "prod-a"
    assert multi.cluster("nope") is None
    assert multi.group_of("edge-2").name == "edge"
    assert multi.gpus("nope") == []
    assert multi.offerings("local", "B200") == []
    assert [g.name for g in multi.groups if multi.offerings(g.name, "h100")] == ["local", "edge"]


def test_default_is_the_smallest_single_node_type_first_in_catalog_order() -> None:
    def cluster(name: str, provider: str, gpu: str, per_node: int, count: int) -> dict[str, Any]:
        return {
            "name": name,
            "adapter": "simulated",
            "provider": provider,
            "region": "r",
            "nodes": [{"gpu": gpu, "gpusPerNode": per_node, "count": count}],
        }

    clusters = [
        cluster("b", "ON-PREM", "B200", 8, 2),
        cluster("gcp", "GCP", "A10", 1, 1),
        cluster("aws", "AWS", "A10", 1, 1),
    ]
    catalog = Catalog.from_data({"clusterGroups": [{"name": "g", "clusters": clusters}]})
    assert _default(catalog, "g", "B200") == parse_instance_type("ON-PREM.GPU.B200_1x")
    defaults = [o.instance_type for o in catalog.offerings("g", "B200") if o.default]
    assert [t.is_multi_node for t in defaults] == [False]
    # On a tie the first one wins (catalog order).
    assert _default(catalog, "g", "A10") == parse_instance_type("GCP.GPU.A10_1x")


def test_a_simulated_cluster_gets_the_catalog_delays() -> None:
    cluster = {
        "name": "sim",
        "adapter": "simulated",
        "provider": "NCP",
        "region": "r",
        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 1}],
        "simulation": {"scheduleSeconds": 0.2, "pullSeconds": 0.2, "readySeconds": 0.5},
    }
    catalog = Catalog.from_data({"clusterGroups": [{"name": "g", "clusters": [cluster]}]})
    adapter = build_adapter(catalog.clusters[0])
    assert isinstance(adapter, SimulatedAdapter)
    assert adapter.delays == SimulationDelays(0.2, 0.2, 0.5)


def test_simulation_upstream_and_kubernetes_worker_access_are_read(tmp_path: Path) -> None:
    sim = {
        "name": "sim",
        "adapter": "simulated",
        "provider": "NCP",
        "region": "r",
        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 1}],
        "simulation": {"upstream": "http://127.0.0.1:9000/"},
    }
    k8s = {
        **{k: v for k, v in sim.items() if k != "simulation"},
        "name": "k8s",
        "adapter": "kubernetes",
        "kubernetes": {
            "kubeconfig": str(tmp_path / "kc"),
            "workerAccess": "serviceDns",
            "clusterDomain": "corp.local",
        },
    }
    catalog = Catalog.from_data({"clusterGroups": [{"name": "g", "clusters": [sim, k8s]}]})
    adapter = build_adapter(catalog.clusters[0])
    assert isinstance(adapter, SimulatedAdapter) and adapter.upstream == "http://127.0.0.1:9000"
    settings = catalog.clusters[1].kubernetes
    assert settings is not None
    assert (settings.worker_access, settings.cluster_domain) == ("serviceDns", "corp.local")


def test_one_type_offered_by_several_clusters_lists_them_all(multi: Catalog) -> None:
    offering = multi.offering("edge", "A100_80GB", "gcp.gpu.a100_80gb_2x")
    assert offering is not None
    assert [c.name for c in offering.clusters] == ["edge-2"]
    assert multi.offering("edge", "A100_80GB", "GCP.GPU.A100_80GB_4x") is None
    # Same GPU from two providers: both offered, default is the first single-node one.
    assert _offered(multi, "edge", "A100_80GB") == [
        "AWS.GPU.A100_80GB_1x",
        "GCP.GPU.A100_80GB_1x",
        "AWS.GPU.A100_80GB_2x",
        "GCP.GPU.A100_80GB_2x",
        "AWS.GPU.A100_80GB_4x",
        "GCP.GPU.A100_80GB_2x.x2",
        "GCP.GPU.A100_80GB_2x.x3",
    ]
    assert [o.default for o in multi.offerings("edge", "A100_80GB")] == [True] + [False] * 6


def test_cluster_capacity_counts_instances_on_an_empty_cluster(builtin: Catalog) -> None:
    ncp = builtin.cluster("sim-ncp")
    assert ncp is not None
    assert ncp.capacity(parse_instance_type("NCP.GPU.H100_1x")) == 16
    assert ncp.capacity(parse_instance_type("NCP.GPU.H100_4x")) == 4
    assert ncp.capacity(parse_instance_type("NCP.GPU.H100_8x.x2")) == 1
    assert ncp.capacity(parse_instance_type("DGXC.GPU.H100_1x")) == 0  # other provider
    assert ncp.capacity(parse_instance_type("NCP.GPU.H100_8x.x3")) == 0


def test_file_settings_are_read(multi: Catalog) -> None:
    sim_a, prod_a = multi.groups[0].clusters
    assert sim_a.simulation.pull_seconds == 0.2
    assert sim_a.k8s_version == "1.30.0"
    assert prod_a.kubernetes is not None
    assert prod_a.kubernetes.kubeconfig == "/etc/nvcf/prod-a.kubeconfig"
    assert prod_a.kubernetes.context == "prod-a"
    assert prod_a.k8s_version is None
    edge_1 = multi.cluster("edge-1")
    assert edge_1 is not None and edge_1.kubernetes is not None
    assert (edge_1.adapter, edge_1.provider, edge_1.kubernetes.in_cluster) == (
        "kubernetes",
        "AWS",
        True,
    )
    assert edge_1.nodes[0].gpu == "A100_80GB"


def test_relative_kubeconfig_is_relative_to_the_catalog_file(multi: Catalog) -> None:
    edge_2 = multi.cluster("edge-2")
    assert edge_2 is not None and edge_2.kubernetes is not None
    assert edge_2.kubernetes.kubeconfig == str(DATA.absolute() / "kube" / "edge-2.yaml")


def test_check_catalog_is_empty_for_a_valid_file() -> None:
    assert check_catalog(DATA / "valid_catalog.yaml") == []


# --- bad files --------------------------------------------------------------------------------


def test_every_mistake_of_a_bad_file_is_reported_with_its_line() -> None:
    f = DATA / "bad_catalog.yaml"
    g0c0 = "clusterGroups[0].clusters[0]"
    g0c1 = "clusterGroups[0].clusters[1]"
    g1c0 = "clusterGroups[1].clusters[0]"
    assert check_catalog(f) == [
        f"{f}:7: {g0c0}.provider: unknown provider 'MARS' (allowed: {', '.join(CSPS)})",
        f'{f}:9: {g0c0}.k8sVersion: must be a string; quote the version, e.g. "1.30.0" (got 1.3)',
        f"{f}:11: {g0c0}.nodes[0].gpusPerNode: must be a positive integer, not 0",
        f"{f}:12: {g0c0}.nodes[1]: missing required field 'gpusPerNode'",
        f"{f}:12: {g0c0}.nodes[1]: unknown field 'gpuPerNode' (did you mean 'gpusPerNode'? "
        "allowed: gpu, gpusPerNode, count, cpu, memory)",
        f"{f}:13: {g0c1}: missing required field 'region'",
        f"{f}:13: {g0c1}: adapter 'kubernetes' needs a 'kubernetes' block: "
        "{kubeconfig, context} or {inCluster: true}",
        f"{f}:17: {g0c1}.simulation: 'simulation' applies only to adapter 'simulated'; remove it",
        f"{f}:18: clusterGroups[1].name: duplicate cluster group name 'LOCAL' "
        "(also clusterGroups[0]; names are case-insensitive)",
        f"{f}:20: {g1c0}.name: duplicate cluster name 'sim-a' (also {g0c0}; cluster names "
        "are unique across all groups and case-insensitive)",
        f"{f}:21: {g1c0}.adapter: Input should be 'simulated' or 'kubernetes', not 'docker'",
        f"{f}:26: {g1c0}.nodes[1]: duplicate node shape h100 with 8 GPUs per node "
        "(also nodes[0]); add the counts into one entry",
    ]


def test_loading_a_bad_file_raises_with_every_problem() -> None:
    f = DATA / "bad_catalog.yaml"
    with pytest.raises(CatalogError) as caught:
        load_catalog(f)
    assert caught.value.source == str(f)
    assert len(caught.value.problems) == 12
    assert str(caught.value).startswith(f"invalid cluster catalog {f} (12 problems):\n{f}:7: ")


def _check(tmp_path: Path, text: str) -> list[str]:
    f = tmp_path / "catalog.yaml"
    f.write_text(text)
    return [p.removeprefix(f"{f}") for p in check_catalog(f)]


CLUSTER = """\
clusterGroups:
  - name: g
    clusters:
      - name: c
        adapter: {adapter}
        provider: NCP
        region: r
        nodes: [{{gpu: H100, gpusPerNode: 8, count: 1{node_extra}}}]
{extra}"""


def test_attributes_are_normalised_at_load_time(tmp_path: Path) -> None:
    """Known attributes take their canonical spelling and repeats (in any case) collapse, so
    every reader (resolver, mutations, adapters) sees one spelling."""
    f = tmp_path / "catalog.yaml"
    extra = "        attributes: [nvlinkoptimized, Fast, NVLINKOPTIMIZED, fast]\n"
    f.write_text(CLUSTER.format(adapter="simulated", node_extra="", extra=extra))
    [cluster] = load_catalog(f).groups[0].clusters
    assert cluster.attributes == ["NVLinkOptimized", "Fast"]


@pytest.mark.parametrize(
    ("adapter", "node_extra", "extra", "problems"),
    [
        (
            "kubernetes",
            "",
            "        kubernetes: {context: x}\n",
            [
                ":9: clusterGroups[0].clusters[0].kubernetes: 'kubeconfig' (path of the "
                "kubeconfig file) is required unless 'inCluster: true'"
            ],
        ),
        (
            "kubernetes",
            "",
            "        kubernetes: {inCluster: true, kubeconfig: /k}\n",
            [
                ":9: clusterGroups[0].clusters[0].kubernetes.kubeconfig: 'kubeconfig' and "
                "'inCluster: true' exclude each other; keep one"
            ],
        ),
        (
            "simulated",
            "",
            "        kubernetes: {kubeconfig: /k}\n",
            [
                ":9: clusterGroups[0].clusters[0].kubernetes: 'kubernetes' applies only to "
                "adapter 'kubernetes'; remove it or set 'adapter: kubernetes'"
            ],
        ),
        (
            "simulated",
            ", memory: lots, cpu: -1",
            "        simulation: {readySeconds: -1}\n",
            [
                ":8: clusterGroups[0].clusters[0].nodes[0].cpu: '-1' is not a Kubernetes "
                "quantity such as 64, 500m or 512Gi",
                ":8: clusterGroups[0].clusters[0].nodes[0].memory: 'lots' is not a Kubernetes "
                "quantity such as 64, 500m or 512Gi",
                ":9: clusterGroups[0].clusters[0].simulation.readySeconds: Input should be "
                "greater than or equal to 0, not -1",
            ],
        ),
        (
            "simulated",
            "",
            "        simulation: {upstream: 'ftp://x'}\n",
            [
                ":9: clusterGroups[0].clusters[0].simulation.upstream: 'ftp://x' is not an "
                "upstream server address such as http://127.0.0.1:9000 (or "
                "grpc://127.0.0.1:9000 for a gRPC server)"
            ],
        ),
        (
            "kubernetes",
            "",
            "        kubernetes: {kubeconfig: /k, workerAccess: nodePort}\n",
            [
                ":9: clusterGroups[0].clusters[0].kubernetes.workerAccess: Input should be "
                "'serviceDns' or 'apiServerProxy', not 'nodePort'"
            ],
        ),
        (
            "simulated",
            ", count: 2",
            "        region: again\n",
            [
                ":8: clusterGroups[0].clusters[0].nodes[0]: duplicate key 'count' "
                "(first at line 8)",
                ":9: clusterGroups[0].clusters[0]: duplicate key 'region' (first at line 7)",
            ],
        ),
        (
            "simulated",
            "",
            "        attributes: []\n        nodez: []\n",
            [
                ":10: clusterGroups[0].clusters[0]: unknown field 'nodez' (did you mean 'nodes'? "
                "allowed: name, adapter, provider, region, k8sVersion, attributes, "
                "availabilityZones, nodes, simulation, kubernetes, apiVersions, helmValidation)"
            ],
        ),
    ],
)
def test_adapter_settings_and_field_rules(
    tmp_path: Path, adapter: str, node_extra: str, extra: str, problems: list[str]
) -> None:
    text = CLUSTER.format(adapter=adapter, node_extra=node_extra, extra=extra)
    assert _check(tmp_path, text) == problems


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        ("", [":1: the file is empty; expected a mapping with 'clusterGroups'"]),
        ("# only a comment\n", [":1: the file is empty; expected a mapping with 'clusterGroups'"]),
        (
            "clusterGroups:\n  - name: g\n    clusters: [\n",
            [":4: not valid YAML: expected the node content, but found '<stream end>'"],
        ),
        (
            "clusterGroups:\n\t- name: g\n",
            [":2: not valid YAML: found character '\\t' that cannot start any token"],
        ),
        (
            "- a\n- b\n",
            [":1: the catalog must be a mapping with 'clusterGroups', not a list"],
        ),
        (
            "clusterGroups:\n  - just-a-name\n  - name: g\n    clusters: {name: c}\n",
            [
                ":2: clusterGroups[0]: must be a mapping of fields, not a string",
                ":4: clusterGroups[1].clusters: must be a list, not a mapping",
            ],
        ),
        (
            "clusterGroups:\n  - name: g\n    clusters:\n      -\n",
            [":4: clusterGroups[0].clusters[0]: must be a mapping of fields, not null (nothing)"],
        ),
        ("clusterGroups: []\n", [":1: clusterGroups: must not be empty"]),
        (
            "clusterGroups:\n  - name: g\n    clusters: []\n",
            [":3: clusterGroups[0].clusters: must not be empty"],
        ),
        (
            "clusterGroups:\n  - name: -bad-\n    clusters: []\n",
            [
                ":2: clusterGroups[0].name: '-bad-' is not a valid name: use 1-63 letters, "
                "digits, '-', '_' or '.', starting and ending with a letter or digit",
                ":3: clusterGroups[0].clusters: must not be empty",
            ],
        ),
        (
            "clusterGroup: []\n",
            [
                ":1: missing required field 'clusterGroups'",
                ":1: unknown field 'clusterGroup' (did you mean 'clusterGroups'? "
                "allowed: clusterGroups)",
            ],
        ),
    ],
)
def test_malformed_files(tmp_path: Path, text: str, problems: list[str]) -> None:
    assert _check(tmp_path, text) == problems


def test_missing_file_is_reported_not_raised(tmp_path: Path) -> None:
    f = tmp_path / "absent.yaml"
    assert check_catalog(f) == [f"{f}: cannot read the file: No such file or directory"]


def test_catalog_from_data_checks_the_same_rules() -> None:
    data = {
        "clusterGroups": [
            {
                "name": "g",
                "clusters": [
                    {
                        "name": "a",
                        "adapter": "simulated",
                        "provider": "NCP",
                        "region": "r",
                        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 1}],
                    },
                    {
                        "name": "A",
                        "adapter": "kubernetes",
                        "provider": "NCP",
                        "region": "r",
                        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 0}],
                    },
                ],
            }
        ]
    }
    with pytest.raises(CatalogError) as caught:
        Catalog.from_data(data, source="inline")
    assert caught.value.problems == [
        "inline: clusterGroups[0].clusters[1].nodes[0].count: must be a positive integer, not 0",
        "inline: clusterGroups[0].clusters[1].name: duplicate cluster name 'A' (also "
        "clusterGroups[0].clusters[0]; cluster names are unique across all groups and "
        "case-insensitive)",
        "inline: clusterGroups[0].clusters[1]: adapter 'kubernetes' needs a 'kubernetes' "
        "block: {kubeconfig, context} or {inCluster: true}",
    ]


def test_catalog_built_from_models_enforces_cross_field_rules() -> None:
    cluster = {
        "name": "a",
        "adapter": "simulated",
        "provider": "NCP",
        "region": "r",
        "nodes": [{"gpu": "H100", "gpusPerNode": 8, "count": 1}],
    }
    spec = CatalogFile.model_validate(
        {
            "clusterGroups": [
                {"name": "g", "clusters": [cluster]},
                {"name": "G", "clusters": [cluster]},
            ]
        }
    )
    with pytest.raises(CatalogError, match="duplicate cluster group name 'G'"):
        Catalog(spec)


# --- resolver ---------------------------------------------------------------------------------


def _errors(
    catalog: Catalog, spec: dict[str, Any], *, is_helm: bool = False
) -> list[tuple[str, str]]:
    result = resolve_spec(catalog, spec, is_helm=is_helm)
    assert isinstance(result, list), f"expected errors, got {result}"
    assert all(isinstance(e, FieldError) for e in result)
    return [(e.field, e.message) for e in result]


def _target(catalog: Catalog, spec: dict[str, Any], *, is_helm: bool = False) -> ResolvedTarget:
    result = resolve_spec(catalog, spec, is_helm=is_helm)
    assert isinstance(result, ResolvedTarget), f"expected a target, got {result}"
    return result


def test_omitted_instance_type_uses_the_groups_default(builtin: Catalog) -> None:
    target = _target(builtin, {"gpu": "h100"})
    assert (target.gpu, target.instance_type.name) == ("H100", "NCP.GPU.H100_1x")


def test_instance_type_in_any_case_resolves_to_the_canonical_one(builtin: Catalog) -> None:
    target = _target(builtin, {"gpu": "b200", "instanceType": "on-prem.gpu.b200_4X"})
    assert target.instance_type.name == "ON-PREM.GPU.B200_4x"


def test_without_backend_the_first_group_offering_the_type_is_chosen(multi: Catalog) -> None:
    # H100 is offered by both groups; only 'edge' offers AWS types.
    assert _target(multi, {"gpu": "H100"}).group.name == "local"
    target = _target(multi, {"gpu": "H100", "instanceType": "AWS.GPU.H100_2x"})
    assert (target.group.name, [c.name for c in target.clusters]) == ("edge", ["edge-1"])


def test_filters_narrow_candidate_clusters(multi: Catalog) -> None:
    spec: dict[str, Any] = {
        "gpu": "L40S",
        "instanceType": "DGXC.GPU.L40S_1x",
        "regions": ["US-WEST-2"],
    }
    assert [c.name for c in _target(multi, spec).clusters] == ["prod-a"]
    spec = {"gpu": "A100_80GB", "availabilityZones": ["eu-west-1a", "x"]}
    assert [c.name for c in _target(multi, spec).clusters] == ["edge-1"]
    spec = {"gpu": "H100", "attributes": ["nvlinkoptimized"], "backend": "LOCAL"}
    assert [c.name for c in _target(multi, spec).clusters] == ["sim-a"]
    spec = {"gpu": "H100", "clusters": ["edge-1"]}
    target = _target(multi, spec)
    assert (target.group.name, target.instance_type.name) == ("edge", "AWS.GPU.H100_1x")
    # Empty lists narrow nothing.
    spec = {"gpu": "H100", "clusters": [], "regions": [], "attributes": [], "backend": None}
    assert _target(multi, spec).group.name == "local"


def test_filters_move_to_the_next_group_when_the_first_has_no_match(multi: Catalog) -> None:
    target = _target(multi, {"gpu": "H100", "regions": ["eu-west-1"]})
    assert (target.group.name, target.instance_type.name) == ("edge", "AWS.GPU.H100_1x")


def test_multi_node_types_are_for_helm_functions_only(builtin: Catalog) -> None:
    spec = {"gpu": "B200", "instanceType": "ON-PREM.GPU.B200_8x.x2"}
    assert _errors(builtin, spec) == [
        (
            f"{SPEC}.instanceType",
            "multi-node instance type 'ON-PREM.GPU.B200_8x.x2' (2 nodes) is only available to "
            "helm functions; container functions run on one node, e.g. ON-PREM.GPU.B200_8x",
        )
    ]
    it = _target(builtin, spec, is_helm=True).instance_type
    assert it.gpus_per_node * it.nodes == 16


@pytest.mark.parametrize(
    ("spec", "errors"),
    [
        ({}, [("gpu", "is required: the GPU model to run on, e.g. L40S")]),
        ({"gpu": "  "}, [("gpu", "is required: the GPU model to run on, e.g. L40S")]),
        ({"gpu": 7}, [("gpu", "is required: the GPU model to run on, e.g. L40S")]),
        (
            {"gpu": "A100"},
            [
                (
                    "gpu",
                    "GPU 'A100' is not offered by any cluster group; "
                    "offered GPUs: H100, L40S, L40, B200",
                )
            ],
        ),
        (
            {"gpu": "A100", "backend": "nvcf-default"},
            [
                (
                    "gpu",
                    "GPU 'A100' is not offered by cluster group 'nvcf-default'; "
                    "offered GPUs: H100, L40S, L40, B200",
                )
            ],
        ),
        (
            {"gpu": "H100", "instanceType": "NCP.GPU.H100"},
            [
                (
                    "instanceType",
                    "'NCP.GPU.H100' is not a valid instance type: 'H100' lacks the '_<N>x' GPU "
                    f"count suffix (e.g. 'H100_1x'); {EXPECTED_SHAPE}",
                )
            ],
        ),
        (
            {"gpu": "H100", "instanceType": 5},
            [
                (
                    "instanceType",
                    f"'5' is not a valid instance type: it must be a string; {EXPECTED_SHAPE}",
                )
            ],
        ),
        (
            # Syntax is checked first and reported together with the GPU problem.
            {"gpu": "A100", "instanceType": "NCP.GPU.A100_0x"},
            [
                (
                    "instanceType",
                    "'NCP.GPU.A100_0x' is not a valid instance type: GPUs per node '0' is not a "
                    f"positive integer; {EXPECTED_SHAPE}",
                ),
                (
                    "gpu",
                    "GPU 'A100' is not offered by any cluster group; "
                    "offered GPUs: H100, L40S, L40, B200",
                ),
            ],
        ),
        (
            {"gpu": "H100", "instanceType": "NCP.GPU.H100_16x"},
            [
                (
                    "instanceType",
                    "instance type 'NCP.GPU.H100_16x' is not offered for GPU H100 by any "
                    "cluster group; offered: nvcf-default: NCP.GPU.H100_1x, NCP.GPU.H100_2x, "
                    "NCP.GPU.H100_4x, NCP.GPU.H100_8x",
                )
            ],
        ),
        (
            {"gpu": "H100", "instanceType": "AWS.GPU.H100_1x", "backend": "nvcf-default"},
            [
                (
                    "instanceType",
                    "instance type 'AWS.GPU.H100_1x' is not offered for GPU H100 by cluster "
                    "group 'nvcf-default'; offered: nvcf-default: NCP.GPU.H100_1x, "
                    "NCP.GPU.H100_2x, NCP.GPU.H100_4x, NCP.GPU.H100_8x",
                )
            ],
        ),
        (
            {"gpu": "H100", "instanceType": "DGXC.GPU.L40S_1x"},
            [
                (
                    "instanceType",
                    "instance type 'DGXC.GPU.L40S_1x' is for GPU L40S, but 'gpu' is 'H100'",
                )
            ],
        ),
        (
            {"gpu": "H100", "backend": "prod"},
            [("backend", "unknown cluster group 'prod'; available: nvcf-default")],
        ),
        (
            {"gpu": "H100", "backend": "nvcf-default", "clusters": ["sim-ncp"]},
            [
                (
                    "backend",
                    "'backend' and 'clusters' cannot be used together: the clusters already "
                    "determine their group; remove one of them",
                )
            ],
        ),
        (
            {"gpu": "H100", "clusters": ["sim-ncp", "sim-gone"]},
            [
                (
                    "clusters[1]",
                    "unknown cluster 'sim-gone'; available: sim-ncp, sim-dgxc, sim-onprem",
                )
            ],
        ),
        (
            {"gpu": "H100", "clusters": ["sim-dgxc"]},
            [
                (
                    "clusters",
                    "none of the clusters sim-dgxc offers NCP.GPU.H100_1x; "
                    "it is offered by: sim-ncp",
                )
            ],
        ),
        (
            {"gpu": "H100", "regions": ["eu-west-1", "eu-north-1"]},
            [
                (
                    "regions",
                    "no cluster offering NCP.GPU.H100_1x in cluster group 'nvcf-default' is in "
                    "region eu-west-1 or eu-north-1; candidate clusters: sim-ncp (us-east-1)",
                )
            ],
        ),
        (
            {"gpu": "H100", "availabilityZones": ["us-east-1a"]},
            [
                (
                    "availabilityZones",
                    "no cluster offering NCP.GPU.H100_1x in cluster group 'nvcf-default' is in "
                    "availability zone us-east-1a; candidate clusters: sim-ncp (no zones "
                    "declared)",
                )
            ],
        ),
        (
            {"gpu": "H100", "attributes": ["NVLinkOptimized"]},
            [
                (
                    "attributes",
                    "no cluster offering NCP.GPU.H100_1x in cluster group 'nvcf-default' has all "
                    "the attributes NVLinkOptimized; candidate clusters: sim-ncp (no attributes)",
                )
            ],
        ),
        (
            {"gpu": "B200", "attributes": ["NVLinkOptimized", "Fast"]},
            [
                (
                    "attributes",
                    "no cluster offering ON-PREM.GPU.B200_1x in cluster group 'nvcf-default' has "
                    "all the attributes NVLinkOptimized, Fast; candidate clusters: sim-onprem "
                    "(NVLinkOptimized)",
                )
            ],
        ),
        (
            {"gpu": "H100", "regions": "us-east-1", "attributes": [""]},
            [
                ("regions", "must be a list of non-empty strings"),
                ("attributes", "must be a list of non-empty strings"),
            ],
        ),
    ],
)
def test_resolver_errors(
    builtin: Catalog, spec: dict[str, Any], errors: list[tuple[str, str]]
) -> None:
    assert _errors(builtin, spec) == [(f"{SPEC}.{f}", m) for f, m in errors]


def test_resolver_lists_offers_of_every_group_and_only_usable_ones(multi: Catalog) -> None:
    assert _errors(multi, {"gpu": "H100", "instanceType": "GCP.GPU.H100_1x"}) == [
        (
            f"{SPEC}.instanceType",
            "instance type 'GCP.GPU.H100_1x' is not offered for GPU H100 by any cluster group; "
            "offered: local: ON-PREM.GPU.H100_1x, ON-PREM.GPU.H100_2x, ON-PREM.GPU.H100_4x, "
            "ON-PREM.GPU.H100_8x; edge: AWS.GPU.H100_1x, AWS.GPU.H100_2x, AWS.GPU.H100_4x, "
            "AWS.GPU.H100_8x",
        )
    ]
    # Helm functions also see the multi-node types.
    message = _errors(multi, {"gpu": "H100", "instanceType": "GCP.GPU.H100_1x"}, is_helm=True)[0][1]
    assert "ON-PREM.GPU.H100_8x; edge" not in message
    assert "ON-PREM.GPU.H100_8x, ON-PREM.GPU.H100_8x.x2; edge" in message


def test_resolver_uses_the_given_path_and_reports_gpu_of_named_clusters(multi: Catalog) -> None:
    result = resolve_spec(
        multi, {"gpu": "B200", "clusters": ["edge-1"]}, is_helm=False, path="specs[3]"
    )
    assert result == [
        FieldError(
            "specs[3].gpu",
            "GPU 'B200' is not offered by cluster group 'edge'; offered GPUs: A100_80GB, H100",
        )
    ]
