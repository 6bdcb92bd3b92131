"""What `nvcf status` prints of the lines kept for a deployment's instances: a failed
instance's last lines, and a Running instance's run before its latest restart."""

from __future__ import annotations

from rich.console import Console

from service.client_cli.views import last_lines


def rendered(dep: dict[str, object]) -> str:
    console = Console(width=200, record=True, color_system=None)
    for part in last_lines(dep):
        console.print(part)
    return console.export_text()


def test_status_shows_the_run_before_a_running_instances_restart() -> None:
    dep = {
        "instances": [
            {"instanceId": "i-1", "phase": "Running", "lastLogs": ["[p/main previous] boom"]},
            {"instanceId": "i-2", "phase": "Running"},
        ],
        "healthInfo": [{"gpu": "H100", "lastLogs": ["[p/main] Traceback"]}],
    }
    text = rendered(dep)
    assert "last lines before a restart (instance i-1):" in text
    assert "  [p/main previous] boom" in text
    assert "i-2" not in text
    assert "last lines of the failed instance (H100):" in text


def test_status_shows_nothing_when_nothing_was_kept() -> None:
    assert rendered({"instances": [{"instanceId": "i-1"}]}) == ""
