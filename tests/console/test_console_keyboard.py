"""The console operated with the keyboard alone in a real headless Chromium: sign in, create a
function, deploy it and invoke it in the playground with Tab, typing, Enter and Space (no
click), and every form control of every view has an accessible name."""

from __future__ import annotations

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys

from tests.support.app import ADMIN_KEY
from tests.support.console import Browser, ConsoleServer, Screenshot

#: Tab presses allowed to reach a control (the page has a few dozen focusable elements)
MAX_TABS = 80

#: the form controls of the login form and the shown view that have no accessible name: no
#: <label for>, no aria-label(ledby), and (a button) no text
UNLABELLED = """
const shown = (el) => !el.closest('[hidden]') && el.type !== 'hidden';
return [...document.querySelectorAll('input, select, textarea, button')]
  .filter(shown)
  .filter((el) => !(el.labels && el.labels.length)
    && !(el.getAttribute('aria-label') || '').trim()
    && !el.getAttribute('aria-labelledby')
    && !(el.tagName === 'BUTTON' && el.textContent.trim()))
  .map((el) => el.id || el.outerHTML.slice(0, 120));
"""


def press(browser: Browser, *keys: str) -> None:
    """Keys sent to whatever has the focus, as a keyboard would."""
    ActionChains(browser.driver).send_keys(*keys).perform()


def focused(browser: Browser, selector: str) -> bool:
    return bool(browser.js("return document.activeElement.matches(arguments[0])", selector))


def tab_to(browser: Browser, selector: str) -> int:
    """Press Tab until `selector` has the focus; how many presses it took."""
    for presses in range(MAX_TABS):
        if focused(browser, selector):
            return presses
        press(browser, Keys.TAB)
    raise AssertionError(f"{selector} never got the focus in {MAX_TABS} Tab presses")


def labelled(browser: Browser, view: str) -> None:
    assert browser.js(UNLABELLED) == [], f"controls without an accessible name in {view}"


def hash_of(browser: Browser) -> str:
    return str(browser.js("return location.hash"))


def test_create_deploy_and_invoke_with_the_keyboard_only(
    console_server: ConsoleServer, browser: Browser, screenshot: Screenshot
) -> None:
    server = console_server
    browser.driver.get(f"{server.base}/console#/functions")
    browser.js("sessionStorage.clear()")
    browser.driver.refresh()
    browser.wait(lambda: browser.js("return !document.getElementById('login').hidden"), "login")
    labelled(browser, "the login form")
    tab_to(browser, "#key-input")
    press(browser, ADMIN_KEY, Keys.ENTER)
    browser.loaded("#/functions")
    labelled(browser, "#/functions")

    tab_to(browser, "#new-function")
    press(browser, Keys.ENTER)
    browser.loaded("#/new")
    labelled(browser, "#/new")
    assert focused(browser, "h1"), "a new view takes the focus to its heading"
    tab_to(browser, "#name")
    press(browser, "keyboard-echo")
    tab_to(browser, "#containerImage")
    press(browser, "nvcr.io/acme/echo:1.0")
    tab_to(browser, "#create-form-submit")
    press(browser, Keys.ENTER)
    browser.wait(lambda: "/versions/" in hash_of(browser), "the new version's view")
    fid, vid = hash_of(browser).split("/")[2], hash_of(browser).split("/")[4]
    version = f"#/functions/{fid}/versions/{vid}"
    browser.loaded(version)
    labelled(browser, version)

    # the version view refreshes itself: the focus stays where the keyboard left it
    tab_to(browser, "#deploy-link")
    first = browser.text("#refreshed")
    browser.wait(lambda: browser.text("#refreshed") != first, "the view refreshed", 10)
    assert focused(browser, "#deploy-link"), "a refresh kept the focus"
    press(browser, Keys.ENTER)
    browser.loaded(f"{version}/deploy")
    labelled(browser, f"{version}/deploy")
    tab_to(browser, "#deploy-form-submit")
    press(browser, Keys.SPACE)
    browser.wait(lambda: hash_of(browser).startswith("#/deployments/"), "the deployment view")
    did = hash_of(browser).split("/")[2]
    browser.wait_text("#status", "ACTIVE")
    labelled(browser, f"#/deployments/{did}")
    screenshot("deployed")

    tab_to(browser, "#invoke-link")
    press(browser, Keys.ENTER)
    browser.loaded(f"{version}/invoke")
    labelled(browser, f"{version}/invoke")
    tab_to(browser, "#invoke-form-submit")
    press(browser, Keys.SPACE)
    browser.wait_text("#answer", '"echo"')
    assert "HTTP 200" in browser.wait_text("#answer-meta", "done after")
    screenshot("invoked")

    # the other operating views: every control named
    for view in (f"#/deployments/{did}/scale", f"#/deployments/{did}/configure"):
        browser.driver.get(f"{server.base}/console{view}")
        browser.loaded(view)
        labelled(browser, view)
    # the only errors: the version's deployment read before it was deployed (404)
    unexpected = [
        p["message"]
        for p in browser.network.problems()
        if not ("/deployments/functions/" in p["message"] and "404" in p["message"])
    ]
    assert unexpected == []
