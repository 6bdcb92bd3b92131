"""The console's task pages in a real headless Chromium against a real server (the simulated
catalog): a task is listed, shown reaching COMPLETED at 100% with its timeline, and deleted
from its page after the confirmation."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.app import ADMIN_KEY
from tests.support.console import Browser, ConsoleServer, Screenshot, assert_private

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


def test_a_task_is_listed_followed_to_completed_and_deleted(
    console_server: ConsoleServer, browser: Browser, screenshot: Screenshot
) -> None:
    task = create_task(console_server, "console-train")
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
    assert_private(browser, console_server)
    assert browser.network.problems() == []
