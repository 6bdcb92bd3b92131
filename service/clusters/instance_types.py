"""Instance type names `<CSP>.GPU.<GPU_NAME>_<N>x[.x<NODES>]` (runtime.md §1).

Parsing, canonical formatting, and the types a node shape offers, as a cluster agent
registers them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.core.numbers import natural

CSPS: tuple[str, ...] = ("ON-PREM", "AWS", "GCP", "OCI", "AZURE", "DGXC", "DGX-CLOUD", "NCP")
EXPECTED_SHAPE = (
    "expected <CSP>.GPU.<GPU_NAME>_<N>x[.x<NODES>], e.g. DGXC.GPU.L40S_1x or ON-PREM.GPU.B200_8x.x2"
)

_GPU_NAME = re.compile(r"[A-Za-z0-9_]+")
#: digits of a GPU or node count in an instance type name
MAX_COUNT_DIGITS = 4


class InstanceTypeError(ValueError):
    """A malformed instance type; the message quotes the value, says what is wrong and the shape."""

    def __init__(self, value: str, problems: list[str]) -> None:
        self.value = value
        self.problems = problems
        super().__init__(
            f"{value!r} is not a valid instance type: {'; '.join(problems)}; {EXPECTED_SHAPE}"
        )


def normalize_csp(value: str) -> str | None:
    """The documented spelling of a CSP name given in any case, or None if unknown."""
    upper = value.upper()
    return upper if upper in CSPS else None


def normalize_gpu(value: str) -> str:
    """GPU names are compared case-insensitively and written upper-case (`l40s` → `L40S`)."""
    return value.upper()


@dataclass(frozen=True)
class InstanceType:
    """A parsed, canonical instance type; build it with `parse_instance_type` or `of`."""

    csp: str
    gpu: str
    gpus_per_node: int
    nodes: int
    name: str

    @classmethod
    def of(cls, csp: str, gpu: str, gpus_per_node: int, nodes: int = 1) -> InstanceType:
        """The instance type with these parts, validated like a parsed one."""
        base = f"{csp}.GPU.{gpu}_{gpus_per_node}x"
        return parse_instance_type(base if nodes == 1 else f"{base}.x{nodes}")

    @property
    def is_multi_node(self) -> bool:
        return self.nodes > 1

    @property
    def description(self) -> str:
        """Human wording: `1x L40S GPU`, `8x H100 GPUs`, `2 nodes x 8x B200 GPUs`."""
        gpus = f"{self.gpus_per_node}x {self.gpu} GPU{'s' if self.gpus_per_node > 1 else ''}"
        return f"{self.nodes} nodes x {gpus}" if self.is_multi_node else gpus

    def __str__(self) -> str:
        return self.name


def parse_instance_type(value: str) -> InstanceType:
    """Parse and canonicalise (`dgxc.gpu.l40s_1X` → `DGXC.GPU.L40S_1x`).

    Raises InstanceTypeError listing every problem found.
    """
    if not isinstance(value, str):
        raise InstanceTypeError(repr(value), ["it must be a string"])
    if not value:
        raise InstanceTypeError(value, ["it is empty"])
    if any(c.isspace() for c in value):
        raise InstanceTypeError(value, ["it must not contain whitespace"])
    parts = value.split(".")
    if len(parts) < 3 or parts[1].upper() != "GPU":
        raise InstanceTypeError(value, ["'.GPU.' must follow the CSP"])
    if len(parts) > 4:
        raise InstanceTypeError(value, [f"too many '.'-separated parts ({len(parts)}, at most 4)"])

    problems: list[str] = []
    csp = normalize_csp(parts[0])
    if not parts[0]:
        problems.append("the CSP is missing")
    elif csp is None:
        problems.append(f"unknown CSP {parts[0]!r} (allowed: {', '.join(CSPS)})")

    gpu, per_node = _parse_gpu_and_count(parts[2], problems)
    nodes = _parse_nodes(parts[3], problems) if len(parts) == 4 else 1

    if problems or csp is None or gpu is None or per_node is None or nodes is None:
        raise InstanceTypeError(value, problems)
    name = f"{csp}.GPU.{gpu}_{per_node}x" + (f".x{nodes}" if nodes > 1 else "")
    return InstanceType(csp=csp, gpu=gpu, gpus_per_node=per_node, nodes=nodes, name=name)


def _parse_gpu_and_count(part: str, problems: list[str]) -> tuple[str | None, int | None]:
    # GPU names may contain '_' (A100_80GB_2x), so the count is the part after the LAST '_'.
    name, sep, count = part.rpartition("_")
    if not sep:
        problems.append(f"{part!r} lacks the '_<N>x' GPU count suffix (e.g. '{part}_1x')")
        return None, None
    gpu: str | None = normalize_gpu(name)
    if not name:
        problems.append("the GPU name is missing before '_<N>x'")
        gpu = None
    elif not _GPU_NAME.fullmatch(name):
        problems.append(f"GPU name {name!r} may contain only letters, digits and '_'")
        gpu = None
    if not count.lower().endswith("x"):
        problems.append(f"GPU count {count!r} must end with 'x' (e.g. '_{count or 1}x')")
        return gpu, None
    digits = count[:-1]
    per_node = natural(digits, max_digits=MAX_COUNT_DIGITS)
    if per_node is None or per_node < 1:
        problems.append(f"GPUs per node {digits[:20]!r} is not a positive integer")
        return gpu, None
    return gpu, per_node


def _parse_nodes(part: str, problems: list[str]) -> int | None:
    nodes = natural(part[1:], max_digits=MAX_COUNT_DIGITS)
    if not part.lower().startswith("x") or nodes is None:
        problems.append(f"node count {part[:20]!r} must be 'x<NODES>' with an integer, e.g. 'x2'")
        return None
    if nodes < 2:
        problems.append(
            f"node count {part!r} must be at least 2 (omit '.x<NODES>' for a single node)"
        )
        return None
    return nodes


def offered_instance_types(
    csp: str, gpu: str, gpus_per_node: int, count: int
) -> list[InstanceType]:
    """Types offered by `count` nodes of `gpus_per_node` GPUs, smallest first.

    `_1x, _2x, _4x, …` (powers of two below G), `_Gx`, then `_Gx.x<k>` for k = 2 … count.
    """
    if gpus_per_node < 1 or count < 1:
        raise ValueError("gpus_per_node and count must be positive")
    sizes: list[int] = []
    size = 1
    while size < gpus_per_node:
        sizes.append(size)
        size *= 2
    sizes.append(gpus_per_node)
    single = [InstanceType.of(csp, gpu, n) for n in sizes]
    multi = [InstanceType.of(csp, gpu, gpus_per_node, k) for k in range(2, count + 1)]
    return single + multi


def shape_offers(
    csp: str, gpu: str, gpus_per_node: int, count: int, instance_type: InstanceType
) -> bool:
    """Whether `instance_type` is among `offered_instance_types(csp, gpu, gpus_per_node,
    count)`, in constant time: a deploy asks this of every candidate cluster, and a shape of
    `count` nodes offers `count - 1` multi-node types."""
    it = instance_type
    if gpus_per_node < 1 or count < 1:
        return False
    if it.csp != normalize_csp(csp) or it.gpu != normalize_gpu(gpu):
        return False
    if it.is_multi_node:
        return it.gpus_per_node == gpus_per_node and it.nodes <= count
    size = it.gpus_per_node
    return size == gpus_per_node or (size < gpus_per_node and size & (size - 1) == 0)
