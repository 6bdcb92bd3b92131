"""The worker-utils sidecar in a task's pod (backends/worker_utils_pod.py, `inject_task`): a
native sidecar (an initContainer with `restartPolicy: Always`, so that the Job completes when
the task container exits) that reads the task container's progress file and results directory
through the same volumes, read-only, passes the restricted pod-security rules, and holds the
pod's end for the platform in its `preStop` hook; objects without one task container are left
alone."""

from __future__ import annotations

import copy

from service.backends.worker_utils_pod import (
    CONTAINER_NAME,
    PORT_NAME,
    WorkerUtilsPod,
    inject_task,
)
from service.charts.policy import restrict
from tests.support.task_objects import (
    PROGRESS_FILE,
    RESULTS_DIR,
    helm_task_objects,
    job,
    secret,
    task_container,
    task_objects,
)

POD = WorkerUtilsPod(
    image="registry.example.com/nvcf-server:1.2",
    max_asset_bytes=1000,
    max_result_bytes=2000,
    max_result_files=7,
    timeout_seconds=60,
    task_linger_seconds=120,
)


def test_the_task_pod_gets_a_native_sidecar_on_the_task_files_volumes() -> None:
    objects = [job(), secret()]
    before = copy.deepcopy(objects)
    assert inject_task(objects, POD)
    spec = objects[0]["spec"]["template"]["spec"]
    # the task container and the volumes are as they were
    assert spec["containers"] == before[0]["spec"]["template"]["spec"]["containers"]
    assert spec["volumes"] == before[0]["spec"]["template"]["spec"]["volumes"]
    [sidecar] = spec["initContainers"]
    assert sidecar["name"] == CONTAINER_NAME
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == POD.image
    assert sidecar["volumeMounts"] == [
        {"name": "nvct-progress", "mountPath": "/var/run/nvct/progress", "readOnly": True},
        {"name": "nvct-results", "mountPath": "/var/run/nvct/results", "readOnly": True},
    ]
    assert sidecar["args"] == [
        "worker-utils",
        "--port",
        "8479",
        "--task-progress-file",
        PROGRESS_FILE,
        "--task-results-dir",
        RESULTS_DIR,
        "--max-result-bytes",
        "2000",
        "--max-result-files",
        "7",
        "--timeout",
        "60",
        "--linger",
        "120",
    ]
    assert sidecar["ports"] == [{"name": PORT_NAME, "containerPort": 8479, "protocol": "TCP"}]
    assert sidecar["lifecycle"] == {"preStop": {"httpGet": {"path": "/nvct/linger", "port": 8479}}}
    # the Secret is untouched; given twice, the sidecar is added once
    assert objects[1] == before[1]
    assert inject_task(objects, POD)
    assert len(spec["initContainers"]) == 1


def test_the_platform_task_job_shares_its_one_task_volume() -> None:
    secret_object, job_object = task_objects()  # as service/tasks/workload.py builds them
    assert inject_task([secret_object, job_object], POD)
    [sidecar] = job_object["spec"]["template"]["spec"]["initContainers"]
    assert sidecar["volumeMounts"] == [{"name": "nvct", "mountPath": "/var/nvct", "readOnly": True}]
    assert sidecar["args"][3:7] == [
        "--task-progress-file",
        "/var/nvct/progress.json",
        "--task-results-dir",
        "/var/nvct/results",
    ]


def test_one_volume_holding_both_paths_is_mounted_once() -> None:
    container = task_container("/nvct/progress.json", "/nvct/results")
    container["volumeMounts"] = [{"name": "nvct", "mountPath": "/nvct/"}]
    objects = [job(container)]
    assert inject_task(objects, POD)
    [sidecar] = objects[0]["spec"]["template"]["spec"]["initContainers"]
    assert sidecar["volumeMounts"] == [{"name": "nvct", "mountPath": "/nvct", "readOnly": True}]


def test_a_path_no_volume_holds_gets_an_empty_dir_in_both_containers() -> None:
    container = task_container("/work/progress.json", "/outputs")
    container["volumeMounts"] = []
    objects = [job(container)]
    assert inject_task(objects, POD)
    spec = objects[0]["spec"]["template"]["spec"]
    added = [
        {"name": "nvct-files-0", "mountPath": "/work"},
        {"name": "nvct-files-1", "mountPath": "/outputs"},
    ]
    assert spec["containers"][0]["volumeMounts"] == added
    assert [v for v in spec["volumes"] if v["name"].startswith("nvct-files")] == [
        {"name": "nvct-files-0", "emptyDir": {}},
        {"name": "nvct-files-1", "emptyDir": {}},
    ]
    assert spec["initContainers"][0]["volumeMounts"] == [{**m, "readOnly": True} for m in added]


def test_a_port_the_task_uses_moves_the_sidecar() -> None:
    objects = [job(task_container(ports=[{"containerPort": 8479}]))]
    assert inject_task(objects, POD)
    [sidecar] = objects[0]["spec"]["template"]["spec"]["initContainers"]
    assert sidecar["ports"][0]["containerPort"] == 8480


def test_the_job_of_a_helm_task_gets_the_sidecar() -> None:
    # every container of the chart was given the task's variables (the dashboard's too):
    # the Job's is the task's; no volume holds /var/nvct there, so an emptyDir is added
    objects = helm_task_objects()
    assert inject_task(objects, POD)
    pods = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in objects
        if "spec" in o and "template" in o["spec"]
    }
    assert "initContainers" not in pods["dashboard"]
    [sidecar] = pods["trainer"]["initContainers"]
    assert sidecar["name"] == CONTAINER_NAME
    mount = {"name": "nvct-files-0", "mountPath": "/var/nvct"}
    assert sidecar["volumeMounts"] == [{**mount, "readOnly": True}]
    assert mount in pods["trainer"]["containers"][0]["volumeMounts"]
    assert {"name": "nvct-files-0", "emptyDir": {}} in pods["trainer"]["volumes"]


def test_objects_without_exactly_one_task_container_are_left_alone() -> None:
    plain = task_container()
    plain["env"] = []
    relative = task_container("progress.json", "results")
    for objects in (
        [job(plain)],
        [job(relative)],
        [*task_objects(), job()],  # two task containers: which one is unknown
    ):
        before = copy.deepcopy(objects)
        assert not inject_task(objects, POD)
        assert objects == before


def test_the_sidecar_passes_the_restricted_rules() -> None:
    objects = task_objects()
    _, clean, _ = restrict(objects, service_name="", inference_port=0, enforce_security=True)
    assert inject_task(objects, POD)
    _, findings, _ = restrict(objects, service_name="", inference_port=0, enforce_security=True)
    assert findings == clean
