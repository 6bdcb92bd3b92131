"""The pod security rules of rendered objects (helm.md §3.1): the Pod Security Standards,
baseline and restricted, plus NVCF's read-only root filesystem; one finding per field per
container, an error when the deployment enforces security, else a warning (policy.py applies
them to every pod template unless the policy is `Unrestricted`):

- `security-host-namespaces`: `hostNetwork`, `hostPID`, `hostIPC` true
- `security-host-ports`: a container port with a `hostPort`
- `security-service-account-token`: `automountServiceAccountToken` true
- `security-privileged`: `privileged` true
- `security-privilege-escalation`: `allowPrivilegeEscalation` true
- `security-capabilities`: `drop` lacks `ALL`, or `add` has more than `NET_BIND_SERVICE`
  or lists a capability twice
- `security-run-as-non-root`: effective `runAsNonRoot` not true
- `security-run-as-user`: effective `runAsUser` 0
- `security-seccomp`: effective seccomp profile not `RuntimeDefault`/`Localhost`
- `security-apparmor`: AppArmor profile (field or annotation) other than runtime default/localhost
- `security-selinux`: SELinux type outside the container types, or a user/role set
- `security-proc-mount`: `procMount` other than `Default`
- `security-sysctls`: a sysctl outside the safe set
- `security-read-only-root-filesystem`: a container's `readOnlyRootFilesystem` not true
"""

from __future__ import annotations

from typing import Any

from service.charts.findings import Finding, Severity, containers, items, join, metadata

ALLOWED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
ALLOWED_SECCOMP = frozenset({"RuntimeDefault", "Localhost"})
ALLOWED_APPARMOR = frozenset({"RuntimeDefault", "Localhost"})
ALLOWED_SELINUX_TYPES = frozenset(
    {"container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def pod_security(
    ref: str, path: str, template: dict[str, Any], severity: Severity
) -> list[Finding]:
    """The security findings of one pod template (`path` within the object `ref`)."""
    spec: dict[str, Any] = template["spec"]
    sp = join(path, "spec")
    pod_sc = spec.get("securityContext") if isinstance(spec.get("securityContext"), dict) else {}
    assert isinstance(pod_sc, dict)
    out: list[Finding] = []

    def pod_finding(rule: str, field: str, message: str) -> None:
        out.append(Finding(rule, severity, ref, field, message))

    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key) is True:
            pod_finding("security-host-namespaces", f"{sp}.{key}", f"{key} must not be true")
    if spec.get("automountServiceAccountToken") is True:
        pod_finding(
            "security-service-account-token",
            f"{sp}.automountServiceAccountToken",
            "automountServiceAccountToken must not be true",
        )
    for i, sysctl in enumerate(items(pod_sc.get("sysctls"))):
        name = sysctl.get("name") if isinstance(sysctl, dict) else None
        if name not in SAFE_SYSCTLS:
            pod_finding(
                "security-sysctls",
                f"{sp}.securityContext.sysctls[{i}].name",
                f"sysctl {name!r} is not in the safe set",
            )
    annotations = metadata(template).get("annotations")
    annotations = annotations if isinstance(annotations, dict) else {}

    for list_key, i, container in containers(spec):
        cp = f"{sp}.{list_key}[{i}]"
        cname = container.get("name")
        sc = container.get("securityContext")
        sc = sc if isinstance(sc, dict) else {}
        scp = f"{cp}.securityContext"

        def emit(rule: str, field: str, message: str, cname: Any = cname) -> None:
            out.append(Finding(rule, severity, ref, field, f"container {cname!r}: {message}"))

        def effective(key: str, scp: str = scp, sc: dict[str, Any] = sc) -> tuple[Any, str]:
            if sc.get(key) is not None:
                return sc[key], f"{scp}.{key}"
            if pod_sc.get(key) is not None:
                return pod_sc[key], f"{sp}.securityContext.{key}"
            return None, f"{scp}.{key}"

        for j, port in enumerate(items(container.get("ports"))):
            if isinstance(port, dict) and port.get("hostPort"):
                emit(
                    "security-host-ports",
                    f"{cp}.ports[{j}].hostPort",
                    f"hostPort {port['hostPort']} is not allowed",
                )
        if sc.get("privileged") is True:
            emit("security-privileged", f"{scp}.privileged", "privileged must not be true")
        if sc.get("allowPrivilegeEscalation") is True:
            emit(
                "security-privilege-escalation",
                f"{scp}.allowPrivilegeEscalation",
                "allowPrivilegeEscalation must not be true",
            )
        caps = sc.get("capabilities") if isinstance(sc.get("capabilities"), dict) else {}
        assert isinstance(caps, dict)
        if "ALL" not in items(caps.get("drop")):
            emit(
                "security-capabilities",
                f"{scp}.capabilities.drop",
                "capabilities must drop ALL",
            )
        raw_add = caps.get("add")
        add = [str(c) for c in (raw_add if isinstance(raw_add, list) else [raw_add]) if c]
        added = list(dict.fromkeys(c for c in add if c not in ALLOWED_CAPABILITIES))
        twice = sorted({c for c in add if add.count(c) > 1})
        problems = []
        if added:
            problems.append(
                f"capabilities {', '.join(added)} may not be added (only NET_BIND_SERVICE)"
            )
        if twice:
            problems.append(f"capabilities.add lists {', '.join(twice)} more than once")
        if problems:
            emit("security-capabilities", f"{scp}.capabilities.add", "; ".join(problems))
        value, field = effective("runAsNonRoot")
        if value is not True:
            emit("security-run-as-non-root", field, "runAsNonRoot must be true")
        value, field = effective("runAsUser")
        if value == 0 and not isinstance(value, bool):
            emit("security-run-as-user", field, "runAsUser must not be 0 (root)")
        value, field = effective("seccompProfile")
        seccomp = value.get("type") if isinstance(value, dict) else None
        if seccomp not in ALLOWED_SECCOMP:
            emit(
                "security-seccomp",
                f"{field}.type",
                "seccompProfile.type must be RuntimeDefault or Localhost"
                + (f", not {seccomp!r}" if seccomp else ""),
            )
        value, field = effective("appArmorProfile")
        apparmor = value.get("type") if isinstance(value, dict) else None
        if apparmor is not None and apparmor not in ALLOWED_APPARMOR:
            emit(
                "security-apparmor",
                f"{field}.type",
                f"appArmorProfile.type {apparmor!r} is not allowed",
            )
        legacy = annotations.get(f"{APPARMOR_ANNOTATION}{cname}")
        if legacy is not None and not (
            legacy == "runtime/default" or str(legacy).startswith("localhost/")
        ):
            emit(
                "security-apparmor",
                join(path, f"metadata.annotations.{APPARMOR_ANNOTATION}{cname}"),
                f"AppArmor profile {legacy!r} is not allowed",
            )
        value, field = effective("seLinuxOptions")
        if isinstance(value, dict):
            se_type = value.get("type")
            if se_type not in (None, "", *ALLOWED_SELINUX_TYPES):
                emit(
                    "security-selinux", f"{field}.type", f"SELinux type {se_type!r} is not allowed"
                )
            for key in ("user", "role"):
                if value.get(key):
                    emit("security-selinux", f"{field}.{key}", f"SELinux {key} must not be set")
        proc_mount = sc.get("procMount")
        if proc_mount not in (None, "Default"):
            emit(
                "security-proc-mount",
                f"{scp}.procMount",
                f"procMount {proc_mount!r} is not allowed",
            )
        if sc.get("readOnlyRootFilesystem") is not True:
            emit(
                "security-read-only-root-filesystem",
                f"{scp}.readOnlyRootFilesystem",
                "readOnlyRootFilesystem must be true (mount an emptyDir where the container "
                "writes)",
            )
    return out
