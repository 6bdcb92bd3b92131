"""A real headless browser for the web console's tests: Debian's `chromium` driven through its
`chromedriver` (both installed by scripts/install-test-services.sh) with Selenium.

Selenium is given both paths, so its manager never downloads a browser or a driver. The
browser logs every network request of the page (DevTools performance log) and its console,
which the tests read to prove where the page connected and what it sent.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome")
DRIVER_CANDIDATES = ("chromedriver",)


class BrowserUnavailable(RuntimeError):
    pass


def _which(names: tuple[str, ...], extra: tuple[str, ...] = ()) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return next((p for p in extra if Path(p).exists()), None)


def start_browser(profile: Path, *, width: int = 1280, height: int = 1000) -> webdriver.Chrome:
    """Headless Chromium with a fresh profile under `profile`, logging network and console."""
    browser = _which(CHROMIUM_CANDIDATES, ("/usr/lib/chromium/chromium",))
    driver = _which(DRIVER_CANDIDATES, ("/usr/lib/chromium/chromedriver",))
    if browser is None or driver is None:
        raise BrowserUnavailable(
            "chromium and chromium-driver are not installed (scripts/install-test-services.sh)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",  # the suite runs as root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        f"--user-data-dir={profile}",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-extensions",
        "--disable-sync",
        "--lang=en-US",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    log = profile.parent / "chromedriver.log"
    try:
        return webdriver.Chrome(options=options, service=Service(driver, log_output=str(log)))
    except Exception as exc:  # the driver's own message says what is wrong
        raise BrowserUnavailable(f"could not start {browser} with {driver}: {exc}") from exc


@dataclass
class Request:
    """A request the page made, as DevTools saw it: the URL and every header sent (those the
    page set and those the browser added)."""

    url: str
    method: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def origin(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"


@dataclass
class NetworkLog:
    """The page's requests and console messages since the browser started. The driver hands
    each log entry out once, so this keeps what it has read."""

    driver: webdriver.Chrome
    by_id: dict[str, Request] = field(default_factory=dict)
    console: list[dict[str, Any]] = field(default_factory=list)

    def requests(self) -> list[Request]:
        for entry in self.driver.get_log("performance"):  # type: ignore[no-untyped-call]
            message = json.loads(entry["message"])["message"]
            method, params = message.get("method"), message.get("params", {})
            if method not in ("Network.requestWillBeSent", "Network.requestWillBeSentExtraInfo"):
                continue
            # a redirect reuses the id: keep each hop
            key = params["requestId"]
            if method == "Network.requestWillBeSent":
                request = params["request"]
                if key in self.by_id and self.by_id[key].url:
                    key = f"{key}/{len(self.by_id)}"
                known = self.by_id.setdefault(key, Request("", ""))
                known.url, known.method = request["url"], request["method"]
                known.headers.update(request.get("headers", {}))
            else:
                self.by_id.setdefault(key, Request("", "")).headers.update(
                    params.get("headers", {})
                )
        self.console.extend(self.driver.get_log("browser"))  # type: ignore[no-untyped-call]
        return list(self.by_id.values())

    def problems(self) -> list[dict[str, Any]]:
        """Console errors (CSP violations, script errors, failed loads) seen so far."""
        self.requests()
        return [e for e in self.console if e.get("level") == "SEVERE"]
