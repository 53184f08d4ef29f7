"""The dashboard in a real browser (headless Chromium driven by Selenium) while a real
cluster trains: the run, its nodes and its charts appear and update without a reload."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster

CHROMEDRIVER = Path("/usr/bin/chromedriver")  # Debian's chromium-driver; never downloaded
CHROMIUM = Path("/usr/bin/chromium")
RUN = "browsed"
ROUNDS = 12
WAIT = 20.0  # bound of each wait; they end as soon as the page shows what is awaited

pytestmark = pytest.mark.skipif(not (CHROMEDRIVER.exists() and CHROMIUM.exists()),
                                reason="needs chromium and chromium-driver "
                                       "(scripts/setup.sh installs them)")


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager must never go online
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1300,1400"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)),
                              options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_run_page_follows_a_run_live(cluster: Cluster, browser) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def text(css: str) -> str:
        """The element's text; the page redraws every second, so an element found may be
        replaced before it is read: then it is looked up again."""
        for _ in range(10):
            try:
                found = browser.find_elements(By.CSS_SELECTOR, css)
                return found[0].text if found else ""
            except StaleElementReferenceException:
                continue
        raise AssertionError(f"{css} was replaced 10 times while being read")

    def until(what: str, condition) -> None:
        WebDriverWait(browser, WAIT, poll_frequency=0.05,
                      ignored_exceptions=[StaleElementReferenceException]).until(
            lambda _: condition(), message=f"{what}\n{cluster.logs()[-3000:]}")

    for _ in range(2):
        cluster.add_node(0.0)
    coordinator = cluster.start_coordinator(2, "--dashboard-port", "0")
    url = coordinator.wait_for(r"dashboard at (http://127\.0\.0\.1:\d+/)").group(1)
    # The page is open before the run exists: it keeps polling until the run appears.
    browser.get(f"{url}runs/{RUN}")
    client = cluster.start_client("letters", str(ROUNDS), "5", "20", "0.0001", "--quiet",
                                  "--run-id", RUN)
    try:
        until("the run shows as running", lambda: text("#run-state") == "running")
        first = text("#run-round .value")
        until("the round moves on without a reload", lambda: text("#run-round .value") not in
              ("", first))
        until("both nodes are listed", lambda: len(browser.find_elements(
            By.CSS_SELECTOR, "#nodes tbody tr")) == 2)
        assert "alive" in text("#nodes tbody")
        until("a chart is drawn", lambda: browser.find_elements(
            By.CSS_SELECTOR, "#chart-validation-error canvas"))
        until("the run completes", lambda: text("#run-state") == "completed")
        until("the last round shows", lambda: text("#run-round .value") == f"{ROUNDS} / {ROUNDS}")
        assert client.wait(30) == 0, client.stderr.read()
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    charts = {e.get_attribute("data-title") for e in  # chart boxes stay, their plots change
              browser.find_elements(By.CSS_SELECTOR, "#charts .chart")}
    assert {"Validation error", "Loss", "Bytes per round", "Units per second",
            "Round phases (s)"} <= charts

    browser.get(url)
    until("the runs page lists the run", lambda: RUN in text("#runs tbody"))
    assert "completed" in text("#runs tbody") and "delta_avg" in text("#runs tbody")
