"""`transitions` is the one writer of a task's status, and each change leaves an event: no
other module assigns `status` (or the last change, `updated_at`) on a task, and the statuses
move only forward."""

from __future__ import annotations

import ast
from pathlib import Path

from service.tasks.models import ACTIVE, TERMINAL, TaskStatus
from service.tasks.transitions import ALLOWED

PACKAGE = Path(__file__).resolve().parents[2] / "service" / "tasks"


def writers(attribute: str) -> set[str]:
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == attribute:
                    found.add(path.name)
    return found


def test_only_transitions_writes_a_tasks_status() -> None:
    assert writers("status") == {"transitions.py"}


def test_only_transitions_moves_a_tasks_last_change() -> None:
    """Its timeline's order rests on `updated_at` never moving back (transitions.touch)."""
    assert writers("updated_at") == {"transitions.py"}


def test_terminal_statuses_never_move_and_active_ones_only_forward() -> None:
    for status in TERMINAL:
        assert status not in ALLOWED
    assert set(ALLOWED) == set(ACTIVE)
    assert TaskStatus.QUEUED not in set().union(*ALLOWED.values())
    assert TaskStatus.EXCEEDED_MAX_QUEUED_DURATION not in ALLOWED[TaskStatus.RUNNING]
