"""Driving the web console in a real browser: the server and browser the fixtures hand out,
the API calls that set the scene, and page helpers that wait on what the page shows.

Page state is read with one script call at a time (the console re-renders its view every two
seconds, so an element found in one call may be replaced by the next), and every wait is a
WebDriverWait on a page condition, never a sleep.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import httpx
import yaml
from selenium import webdriver
from selenium.common.exceptions import (
    ElementClickInterceptedException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from tests.support.app import ADMIN_KEY
from tests.support.browser import NetworkLog, Request
from tests.support.registry import RegistryServer

BUILTIN_CATALOG = Path(__file__).parents[2] / "service" / "clusters" / "default_catalog.yaml"
KEY_ITEM = "nvcf-console-key"
T = TypeVar("T")
#: `screenshot(label)` (a fixture): the whole page saved as an artifact, its path returned
Screenshot = Callable[[str], Path]


@dataclass(frozen=True)
class ConsoleServer:
    base: str  # http://127.0.0.1:PORT
    registry: RegistryServer

    def api(self, method: str, path: str, body: Any = None, key: str = ADMIN_KEY) -> Any:
        resp = httpx.request(
            method,
            f"{self.base}/v2/nvcf{path}",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text
        return resp.json()


@dataclass
class Browser:
    driver: webdriver.Chrome
    network: NetworkLog

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def text(self, selector: str) -> str | None:
        """The text of the first element matching `selector`, None when there is none."""
        return self.js(  # type: ignore[no-any-return]
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null",
            selector,
        )

    def count(self, selector: str) -> int:
        return int(self.js("return document.querySelectorAll(arguments[0]).length", selector))

    def wait(self, condition: Callable[[], T], message: str, seconds: float = 60) -> T:
        """Wait until `condition()` is truthy (it is retried while the view re-renders)."""
        wait = WebDriverWait(
            self.driver,
            seconds,
            poll_frequency=0.2,
            ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
        )
        return wait.until(lambda _: condition(), message)

    def wait_text(self, selector: str, wanted: str, seconds: float = 60) -> str:
        def found() -> str | None:
            text = self.text(selector)
            return text if text is not None and wanted in text else None

        text = self.wait(found, f"'{wanted}' in {selector}", seconds)
        assert text is not None
        return text

    def click(self, selector: str) -> None:
        """Click the element, again if the view replaced it under the pointer."""

        def clicked() -> bool:
            try:
                self.driver.find_element(By.CSS_SELECTOR, selector).click()
            except (StaleElementReferenceException, ElementClickInterceptedException):
                return False
            return True

        self.wait(clicked, f"clickable {selector}")

    def loaded(self, fragment: str) -> None:
        """Wait until the view of `fragment` has been rendered at least once."""
        self.wait(
            lambda: self.js("return document.body.dataset.loaded") == fragment,
            f"view {fragment} rendered (now {self.driver.current_url})",
        )

    def sign_in(self, key: str) -> None:
        self.wait(lambda: self.js("return !document.getElementById('login').hidden"), "login")
        field = self.driver.find_element(By.ID, "key-input")
        field.clear()
        field.send_keys(key)
        self.driver.find_element(By.ID, "key-submit").click()

    def open(self, server: ConsoleServer, fragment: str = "#/functions") -> None:
        """Load the console at `fragment`, pasting the admin key if it asks for one."""
        self.driver.get(f"{server.base}/console{fragment}")
        self.wait(
            lambda: self.js(
                "return !document.getElementById('login').hidden || !!document.body.dataset.loaded"
            ),
            "the console asks for a key or shows a view",
        )
        if self.js("return !document.getElementById('login').hidden"):
            self.sign_in(ADMIN_KEY)
        self.loaded(fragment)

    def stored_key(self) -> str | None:
        return self.js("return sessionStorage.getItem(arguments[0])", KEY_ITEM)  # type: ignore[no-any-return]


def fast_catalog(directory: Path) -> Path:
    """The built-in catalog (same groups, clusters and shapes) with near-zero delays."""
    data = yaml.safe_load(BUILTIN_CATALOG.read_text())
    for group in data["clusterGroups"]:
        for cluster in group["clusters"]:
            cluster["simulation"] = {
                "scheduleSeconds": 0.05,
                "pullSeconds": 0.05,
                "readySeconds": 0.1,
            }
    path = directory / "clusters.yaml"
    path.write_text(json.dumps(data))
    return path


def header(request: Request, name: str) -> str | None:
    return next((v for k, v in request.headers.items() if k.lower() == name.lower()), None)


def assert_private(browser: Browser, server: ConsoleServer, key: str = ADMIN_KEY) -> None:
    """Everything the page loaded came from the server itself; the key left the browser only
    as the Authorization header of API requests, never in a URL, and is kept in this tab's
    session storage only."""
    requests = browser.network.requests()
    pages = [r for r in requests if r.url]
    assert pages, "the browser logged no request"
    assert sorted({r.url for r in pages if r.origin != server.base}) == []
    encoded = {key, quote(key, safe=""), quote(f"Bearer {key}", safe="")}
    assert [r.url for r in pages if any(k in r.url for k in encoded)] == []
    for request in requests:
        for name, value in request.headers.items():
            if key in value:
                assert name.lower() == "authorization", (name, request.url)
                assert value == f"Bearer {key}", (name, request.url)
                assert request.url == "" or urlsplit(request.url).path.startswith(
                    ("/v2/nvcf/", "/v1/nvct/")
                )
    assert [r for r in pages if header(r, "Authorization") == f"Bearer {key}"], "no API call"
    assert key not in browser.driver.current_url
    assert browser.stored_key() == key
    assert browser.js("return [localStorage.length, document.cookie]") == [0, ""]
    assert browser.driver.get_cookies() == []
