"""Objects of the Kubernetes adapter tests: an instance, a rendered chart (Deployment and
Service `web`) and the objects the reconciler hands to the adapter after install-time
mutation."""

from __future__ import annotations

from typing import Any

from service.backends import InstanceSpec
from service.charts.mutate import mutate_for_install

PULL_SECRET = "nvcf-pull-nvcr-io"


def instance(n: int = 1, worker_service: str | None = "web") -> InstanceSpec:
    return InstanceSpec(
        instance_id=f"inst-{n}",
        function_id="fn-1",
        version_id="ver-1",
        instance_type="NCP.GPU.H100_1x",
        gpu="H100",
        gpus_per_node=1,
        cluster="k8s-test",
        nca_id="nca-1",
        worker_service=worker_service,
    )


def chart_objects(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    """A rendered chart: Deployment `web` and Service `web` (selector app=web)."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "inference",
                            "image": "nvcr.io/acme/inference:1.0",
                            "ports": [{"containerPort": 8000, "name": "http"}],
                            "env": [{"name": "NVCF_REGION", "value": "chart-default"}],
                            "resources": {
                                "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
                            },
                        }
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 8000, "targetPort": "http"}]},
    }
    return [deployment, service, *extra]


def install(
    inst: InstanceSpec, objects: list[dict[str, Any]] | None = None, *, nvlink: bool = False
) -> list[dict[str, Any]]:
    """The objects the reconciler hands to the adapter (helm.md §5 mutations)."""
    return mutate_for_install(
        objects if objects is not None else chart_objects(),
        namespace=inst.namespace,
        instance_id=inst.instance_id,
        function_id=inst.function_id,
        version_id=inst.version_id,
        function_name="echo",
        nca_id=inst.nca_id,
        instance_type=inst.instance_type,
        backend="k8s-group",
        region="us-west-2",
        pull_secrets=[(PULL_SECRET, {"auths": {"nvcr.io": {"auth": "JG9hdXRodG9rZW46bnZhcGk="}}})],
        nvlink=nvlink,
    )
