"""The simulated scheduler: the cluster's nodes, GPU accounting, and the queues that bind
pods to nodes (best fit, honouring node affinity) as the clock advances."""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from datetime import datetime

from service.backends.protocol import NodeShape
from service.backends.scheduling import node_affinity_matches
from service.backends.simulated.model import Node, SimPod, secs
from service.backends.simulated.timeline import PodTimeline
from service.core.kube import (
    CLIQUE_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    INSTANCE_TYPE_LABEL,
    instance_type_label,
)


class Scheduler:
    """Nodes built from the cluster's shapes, and the pods waiting for them."""

    def __init__(
        self,
        name: str,
        provider: str,
        shapes: Sequence[NodeShape],
        *,
        nvlink: bool,
        timeline: PodTimeline,
    ) -> None:
        self.timeline = timeline
        self.nodes: list[Node] = []
        # So that a call costs what the pods it concerns cost, not the cluster: pods not yet
        # looked at by the scheduler, by (created_at, seq); pods that did not fit, retried only
        # after GPUs were freed; bound pods that will finish, by finishing time.
        self._queued: list[tuple[datetime, int, SimPod]] = []
        self._waiting: dict[int, SimPod] = {}
        self._finishing: list[tuple[datetime, int, SimPod]] = []
        self._gpus_freed = False
        #: pods bound or found unschedulable since the adapter last took them (change feed)
        self.decided: list[SimPod] = []
        self._matching_cache: dict[str, tuple[tuple[int, ...], frozenset[int]]] = {}
        # Node indices (ascending) by free GPUs, so best fit looks at the fullest nodes that
        # still fit first instead of at every node: a pod costs what it binds, not the cluster.
        self._by_free: dict[int, list[int]] = {}
        for shape in shapes:
            for i in range(shape.count):
                node_name = f"{name}-{shape.gpu.lower()}-{shape.gpus_per_node}x-{i}"
                labels = {
                    "kubernetes.io/hostname": node_name,
                    INSTANCE_TYPE_LABEL: instance_type_label(provider, shape.gpu.upper()),
                    GPU_PRODUCT_LABEL: shape.gpu.upper(),
                    "nvidia.com/gpu.count": str(shape.gpus_per_node),
                }
                if nvlink:
                    labels[CLIQUE_LABEL] = f"{name}-{shape.gpu.lower()}.0"
                self.nodes.append(Node(node_name, shape.gpu.upper(), shape.gpus_per_node, labels))
        self.node_index = {n.name: i for i, n in enumerate(self.nodes)}
        for i, node in enumerate(self.nodes):
            self._by_free.setdefault(node.free, []).append(i)

    def _allocate(self, index: int, gpus: int) -> None:
        """Take `gpus` on node `index` (negative: give them back), keeping the index."""
        node = self.nodes[index]
        bucket = self._by_free[node.free]
        del bucket[bisect_left(bucket, index)]
        if not bucket:
            del self._by_free[node.free]
        node.allocated += gpus
        insort(self._by_free.setdefault(node.free, []), index)

    def enqueue(self, pod: SimPod) -> None:
        """A new pod for the scheduler to look at once `schedule_seconds` have passed."""
        heapq.heappush(self._queued, (pod.created_at, pod.seq, pod))

    def remove(self, pod: SimPod) -> None:
        """The pod left its namespace: the scheduler forgets it (its queue entries go lazily)."""
        pod.removed = True
        self._waiting.pop(pod.seq, None)

    def release(self, pod: SimPod) -> None:
        if pod.node is not None and not pod.released:
            self._allocate(self.node_index[pod.node], -pod.gpus)
            pod.released = True
            if pod.gpus:
                self._gpus_freed = True

    def advance(self, now: datetime) -> None:
        """Bring the model to `now`: free GPUs of finished pods, then schedule waiting pods.

        Equivalent to going through every pod in (created_at, seq) order, without doing so:
        finished pods come off a heap by finishing time; pods the scheduler has not looked at
        come off a heap once eligible; pods that did not fit are retried only when GPUs were
        freed since they last failed (otherwise they would fail again, unchanged), merged in
        creation order with the newly eligible ones.
        """
        finishing = self._finishing
        while finishing and finishing[0][0] <= now:
            pod = heapq.heappop(finishing)[2]
            if not pod.removed:
                self.release(pod)
        delay = secs(self.timeline.delays.schedule_seconds)
        queued = self._queued
        fresh: list[SimPod] = []
        while queued and (queued[0][2].removed or queued[0][0] + delay <= now):
            pod = heapq.heappop(queued)[2]
            if not pod.removed:
                fresh.append(pod)
        retry = self._gpus_freed and bool(self._waiting)
        self._gpus_freed = False
        if not fresh and not retry:
            return
        candidates: Iterable[SimPod] = fresh
        max_free = 0
        if retry:
            waiting = sorted(self._waiting.values(), key=lambda p: (p.created_at, p.seq))
            candidates = heapq.merge(waiting, fresh, key=lambda p: (p.created_at, p.seq))
            max_free = max(self._by_free, default=0)
        for pod in candidates:
            eligible = pod.created_at + delay
            if pod.unschedulable_since is not None:  # a retry
                if now < eligible:  # only with a clock that went back: try again next time
                    self._gpus_freed = True
                    continue
                if pod.gpus > max_free:
                    continue  # cannot fit anywhere; failing again would change nothing
            index, message = self._pick_node(pod)
            if index is None:
                pod.unschedulable_since = pod.unschedulable_since or eligible
                pod.schedule_message = message
                self.decided.append(pod)
                if pod.fault != "Unschedulable":  # that fault never schedules: no retries
                    self._waiting[pod.seq] = pod
                continue
            self._waiting.pop(pod.seq, None)
            self._allocate(index, pod.gpus)
            pod.node = self.nodes[index].name
            # Retried pods bind when room appeared; `now` is the call that freed it.
            pod.scheduled_at = eligible if pod.unschedulable_since is None else now
            self.decided.append(pod)
            self.ends_changed(pod)

    def ends_changed(self, pod: SimPod) -> None:
        """The bound pod's end is (now) known: its GPUs free then, as Kubernetes frees a
        terminated pod's, not at its deletion. An earlier entry for it stays: releasing is
        idempotent, and a pod never ends later than it was going to."""
        finished = self.timeline.terminal_at(pod) if pod.node is not None else None
        if finished is not None:
            heapq.heappush(self._finishing, (finished, pod.seq, pod))

    def next_eligible(self) -> datetime | None:
        """When the first queued pod becomes eligible for scheduling (None: none queued)."""
        if not self._queued:
            return None
        return self._queued[0][0] + secs(self.timeline.delays.schedule_seconds)

    def _matching(self, pod: SimPod) -> tuple[int, ...]:
        """Indices of the nodes the pod's node selector and affinity allow, in node order."""
        if pod.matching is None:
            key = repr((pod.spec.get("nodeSelector"), pod.spec.get("affinity")))
            cached = self._matching_cache.get(key)
            if cached is None:
                matching = tuple(
                    i for i, n in enumerate(self.nodes) if node_affinity_matches(pod.spec, n.labels)
                )
                cached = (matching, frozenset(matching))
                if len(self._matching_cache) >= 1024:
                    self._matching_cache.clear()
                self._matching_cache[key] = cached
            pod.matching, pod.matching_set = cached
        return pod.matching

    def free_after_queued_pods(self) -> list[int]:
        """Free GPUs per node once pods the scheduler has not looked at yet are placed.

        Without this, an instance applied a moment ago would not count against capacity until
        its pods are bound, and placement could promise the same GPUs twice.
        """
        free = [n.free for n in self.nodes]
        queued = sorted(
            entry
            for entry in self._queued
            if not entry[2].removed
            and entry[2].node is None
            and entry[2].unschedulable_since is None
            and entry[2].fault != "Unschedulable"
        )
        for _, _, pod in queued:
            best: int | None = None
            for i in self._matching(pod):
                if free[i] >= pod.gpus and (best is None or free[i] < free[best]):
                    best = i
            if best is not None:
                free[best] -= pod.gpus
        return free

    def _pick_node(self, pod: SimPod) -> tuple[int | None, str]:
        total = len(self.nodes)
        if pod.fault == "Unschedulable":
            return None, (
                f"0/{total} nodes are available: {total} node(s) didn't match Pod's node "
                f"affinity/selector. preemption: 0/{total} nodes are available: {total} "
                "Preemption is not helpful for scheduling."
            )
        matching = self._matching(pod)
        # Best fit keeps whole nodes free for full-node and multi-node instance types; ties go
        # to the first node: the fewest free GPUs that fit, then the lowest index.
        allowed = None if len(matching) == total else pod.matching_set
        for free in sorted(f for f in self._by_free if f >= pod.gpus):
            for i in self._by_free[free]:
                if allowed is None or i in allowed:
                    return i, ""
        parts = []
        if len(matching):
            parts.append(f"{len(matching)} Insufficient {GPU_RESOURCE}")
        if total - len(matching):
            parts.append(
                f"{total - len(matching)} node(s) didn't match Pod's node affinity/selector"
            )
        return None, (
            f"0/{total} nodes are available: {', '.join(parts)}. preemption: 0/{total} nodes are "
            f"available: {len(matching)} No preemption victims found for incoming pod, "
            f"{total - len(matching)} Preemption is not helpful for scheduling."
        )
