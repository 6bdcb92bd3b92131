"""The console's task pages in a real headless Chromium against a real server (the simulated
catalog): a task is listed, shown reaching COMPLETED at 100% with its timeline, and deleted
from its page after the confirmation; a running task's page leads to its container's lines,
followed until it is canceled."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.app import ADMIN_KEY
from tests.support.console import Browser, ConsoleServer, Screenshot, assert_private
from tests.support.tasks import script

pytestmark = pytest.mark.registry


def nvct(server: ConsoleServer, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(
        method,
        f"{server.base}/v1/nvct{path}",
        json=body,
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=30,
    )


def create_task(server: ConsoleServer, name: str, **changes: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "gpuSpecification": {"gpu": "L40S", "instanceType": "DGXC.GPU.L40S_1x"},
        "containerImage": "nvcr.io/acme/trainer:1.0",
        "resultHandlingStrategy": "NONE",
        **changes,
    }
    resp = nvct(server, "POST", "/tasks", body)
    assert resp.status_code == 200, resp.text
    task: dict[str, Any] = resp.json()["task"]
    return task


def test_a_task_is_listed_followed_to_completed_and_deleted_and_a_running_ones_logs(
    console_server: ConsoleServer, browser: Browser, screenshot: Screenshot
) -> None:
    task = create_task(console_server, "console-train")
    # runs at 10% until it is canceled
    hangs = script(steps=[{"after": 0.1, "percent": 10}], exitAfter=None)
    logged = create_task(console_server, "console-logged", containerEnvironment=hangs)
    browser.open(console_server, "#/tasks")
    row = f'#tasks tr[data-task-id="{task["id"]}"]'
    browser.wait_text(row, "console-train")
    browser.wait_text(row, "COMPLETED")
    screenshot("tasks")

    browser.click(f"{row} a")
    browser.loaded(f"#/tasks/{task['id']}")
    browser.wait_text("#task-status", "COMPLETED")
    assert "100%" in (browser.text("#task-progress") or "")
    browser.wait_text("#task-events", "completed")
    assert browser.count("#cancel-task") == 0  # an ended task cannot be canceled
    assert "No results reported" in (browser.text("#task-results") or "")
    screenshot("task")

    browser.click("#delete-task")
    alert = browser.wait(lambda: browser.driver.switch_to.alert, "the confirmation")
    assert "console-train" in alert.text
    alert.accept()
    browser.loaded("#/tasks")
    browser.wait(lambda: browser.count(row) == 0, "the deleted task gone from the list")
    assert nvct(console_server, "GET", f"/tasks/{task['id']}").status_code == 404

    browser.click(f'#tasks tr[data-task-id="{logged["id"]}"] a')
    browser.loaded(f"#/tasks/{logged['id']}")
    browser.wait_text("#task-progress", "10%")
    browser.click("#task-logs-link")
    browser.loaded(f"#/tasks/{logged['id']}/logs")
    browser.wait_text("#log-state", "following")
    browser.wait_text("#log", "INFO     progress 10%")
    assert "/task] INFO     Starting task container task" in (browser.text("#log") or "")
    screenshot("task-logs")
    assert nvct(console_server, "POST", f"/tasks/{logged['id']}/cancel").status_code == 200
    browser.wait_text("#log-state", "the log ended")
    assert_private(browser, console_server)
    assert browser.network.problems() == []
