"""The dashboard in a real browser (headless Chromium driven by Selenium) while a real
cluster trains: the run, its nodes and its charts appear and update without a reload; and
the pages of a run the coordinator finds in its store."""

from __future__ import annotations

import json
import math
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Cluster
from tests.programs import require
from tests.unit.test_compare_runs import run_folder
from thrift_trainer.coordinator.checkpoint import METRICS_FILE
from thrift_trainer.coordinator.run_store import RunStore

CHROMEDRIVER = Path("/usr/bin/chromedriver")  # Debian's chromium-driver; never downloaded
CHROMIUM = Path("/usr/bin/chromium")
RUN = "browsed"
ROUNDS = 12
WAIT = 20.0  # bound of each wait; they end as soon as the page shows what is awaited


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    require([str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()],
            "apt-get install chromium chromium-driver; scripts/setup.sh installs them")
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

    # The page polls once a second: each reply is held so that the run lasts several
    # seconds and the page sees it running, not only completed.
    for _ in range(2):
        cluster.add_node(0.0, "--link-delay-ms", "100")
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
        # alive while the run goes on, and as they were when it ended once it is over
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


LONG_RUN = 80  # rounds: more than a chart marks with points when every round has a value
NODE = "127.0.0.1:9"  # the stored run's node; nothing needs to listen there


def texts(browser, css: str) -> list[str]:
    """The texts of the elements `css` selects (a row's: its cells' joined by spaces), read
    in one step: the pages redraw their tables every second, so elements found by one
    call may be gone by the next."""
    return browser.execute_script("""
        return Array.from(document.querySelectorAll(arguments[0]), e => e.tagName === "TR"
            ? Array.from(e.cells, c => c.innerText.trim()).join(" ") : e.innerText.trim());""",
        css)


def click(browser, css: str) -> None:
    """Click the element `css` selects, found and clicked in one step (see `texts`)."""
    browser.execute_script("document.querySelector(arguments[0]).click();", css)


def store_a_finished_gan_run(run_root: Path, run_id: str) -> None:
    """A completed run in a coordinator's run folder, as a run leaves it: every round's
    metrics, the inception score measured once (the last round), and its node."""
    rows = [{"round": r, "validation_error": None, "train_loss": 1.0 / r, "seconds": 0.5,
             "bytes_down": 1000 * r, "bytes_up": 2000 * r} for r in range(1, LONG_RUN + 1)]
    rows[-1].update(inception_score=3.5, fid_features=120.0, fid_logits=40.0)
    run_dir = run_root / run_id
    run_dir.mkdir(parents=True)
    (run_dir / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    with RunStore(run_root / "runs.db") as store:
        store.create_run(run_id, algorithm="fl_gan", model="dcgan", dataset="mnist",
                         rounds=LONG_RUN)
        for row in rows:
            store.record_round(run_id, row["round"], validation_error=math.nan,
                               validation_loss=math.nan, train_loss=row["train_loss"],
                               seconds=0.5, completed_units=4, discarded_units=0)
        store.node_answer(run_id, NODE, "completed", False, samples=64)
        store.end_run(run_id, "completed")


def series_pixels(browser, chart: str) -> int:
    """Pixels of a chart's canvas in its first series' colour (run.js COLORS[0])."""
    return browser.execute_script("""
        const canvas = document.querySelector(arguments[0] + " canvas");
        if (!canvas) return 0;
        const {data} = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
        let count = 0;
        for (let i = 0; i < data.length; i += 4) {
          if (Math.abs(data[i] - 0x2f) < 40 && Math.abs(data[i + 1] - 0x6f) < 40 &&
              Math.abs(data[i + 2] - 0xdd) < 40 && data[i + 3] > 128) count++;
        }
        return count;""", chart)


def test_the_pages_of_a_stored_run_show_its_metrics_and_nodes_as_it_ended(
        cluster: Cluster, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def until(what: str, condition) -> None:
        WebDriverWait(browser, WAIT, poll_frequency=0.05).until(
            lambda _: condition(), message=f"{what}\n{cluster.logs()[-3000:]}")

    store_a_finished_gan_run(cluster.workdir / "runs", "stored")
    cluster.add_node(0.0)
    coordinator = cluster.start_coordinator(2, "--dashboard-port", "0")
    url = coordinator.wait_for(r"dashboard at (http://127\.0\.0\.1:\d+/)").group(1)

    browser.get(url)
    until("the runs page lists the run", lambda: browser.find_elements(
        By.CSS_SELECTOR, "#runs tbody tr"))
    assert browser.execute_script(  # the row fits the page
        "return document.querySelector('#runs').getBoundingClientRect().right "
        "<= document.documentElement.clientWidth")
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#runs thead th")]
    cells = dict(zip(headers, texts(browser, "#runs tbody tr:first-child td"), strict=True))
    assert (cells["training loss"], cells["IS"], cells["FID"]) == ("0.01250", "3.500", "120")

    browser.get(f"{url}runs/stored")
    until("the nodes are listed", lambda: browser.find_elements(
        By.CSS_SELECTOR, "#nodes tbody tr"))
    assert "alive" in browser.find_element(By.CSS_SELECTOR, "#nodes tbody").text
    until("the score measured once is drawn",
          lambda: series_pixels(browser, "#chart-inception-score") > 0)


def test_the_run_page_of_a_federated_run_lists_its_clients_and_charts_their_spread(
        cluster: Cluster, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    cluster.add_node(0.0, "--clients", "0-3")
    cluster.add_node(0.0, "--clients", "4-7")
    url, result = _federated_run(cluster, "clients.count=8", "clients.per_round=3",
                                 "clients.validation_fraction=0.25", "clients.eval_every=3")
    browser.get(f"{url}runs/{result['run_id']}")
    WebDriverWait(browser, WAIT, poll_frequency=0.05).until(
        lambda _: browser.find_elements(By.CSS_SELECTOR, "#clients tbody tr"),
        message=cluster.logs()[-3000:])
    rows = texts(browser, "#clients tbody tr")
    trained = {line["client"] for line in _client_lines(cluster, result["run_id"])}
    assert [row.split()[0] for row in rows] == sorted(trained, key=lambda c: int(c[6:]))
    assert sum(int(row.split()[1]) for row in rows) == 9  # 3 clients a round, 3 rounds
    assert sum(int(row.split()[8]) for row in rows) == 8  # every client scored after round 3
    WebDriverWait(browser, WAIT, poll_frequency=0.05).until(
        lambda _: series_pixels(browser, "#chart-client-loss-worst10") > 0,
        message="the worst 10 % of the clients' losses is charted")
    WebDriverWait(browser, WAIT, poll_frequency=0.05).until(
        lambda _: series_pixels(browser, "#chart-clients-validation-accuracy") > 0,
        message="the clients' validation accuracy is charted")
    with urllib.request.urlopen(f"{url}metrics", timeout=WAIT) as response:
        metrics = response.read().decode()
    for figure in ("clients_trained", "client_loss_mean", "client_loss_worst10",
                   "federated_val_accuracy", "client_val_accuracy_worst10"):
        assert re.search(rf'trainer_run_metric{{metric="{figure}",run="{result["run_id"]}"}} '
                         r"[0-9.e+-]+", metrics), figure  # aggregates, no per-client series
    assert "client0" not in metrics


def test_the_run_page_of_a_private_run_shows_the_budget_it_spent(cluster: Cluster,
                                                                 browser) -> None:
    """The epsilon of a private run (docs/privacy.md): its card shows the last round's, and
    its chart draws every round's."""
    from selenium.webdriver.support.ui import WebDriverWait

    cluster.add_node(0.0)
    url, result = _federated_run(cluster, "clients.count=20", "clients.per_round=4",
                                 "privacy.clip=0.5", "privacy.noise_multiplier=1.1",
                                 "privacy.delta=1e-3")
    spent = result["history"][-1]["epsilon"]
    browser.get(f"{url}runs/{result['run_id']}")
    WebDriverWait(browser, WAIT, poll_frequency=0.05).until(
        lambda _: [math.isclose(float(text), spent, rel_tol=1e-3)  # 4 digits shown
                   for text in texts(browser, "#run-epsilon .value")] == [True],
        message=f"the card shows epsilon {spent:.4g}")
    WebDriverWait(browser, WAIT, poll_frequency=0.05).until(
        lambda _: series_pixels(browser, "#chart-privacy-spent-epsilon-") > 0,
        message="epsilon is charted")


def _federated_run(cluster: Cluster, *sets: str) -> tuple[str, dict]:
    """The dashboard's URL and the result of a 3-round federated letters run with ``sets``
    (SECTION.KEY=VALUE), on a coordinator started with its dashboard."""
    coordinator = cluster.start_coordinator(2, "--dashboard-port", "0")
    url = coordinator.wait_for(r"dashboard at (http://127\.0\.0\.1:\d+/)").group(1)
    federated = ["run.model=mlp_classifier", "data.format=letters", "delta_avg.epochs=1",
                 "delta_avg.local_optimizer=sgd", "run.rounds=3", *sets]
    return url, cluster.train_json(*[arg for item in federated for arg in ("--set", item)])


def _client_lines(cluster: Cluster, run_id: str) -> list[dict]:
    path = cluster.workdir / "runs" / run_id / "clients.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_runs_ticked_on_the_runs_page_are_compared_side_by_side(
        cluster: Cluster, browser) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def until(what: str, condition) -> None:
        WebDriverWait(browser, WAIT, poll_frequency=0.05).until(
            lambda _: condition(), message=f"{what}\n{cluster.logs()[-3000:]}")

    runs = {"fast-s1": ([0.6, 0.4, 0.3], 0.1, 1), "fast-s2": ([0.6, 0.35, 0.25], 0.1, 2),
            "slow-s1": ([0.7, 0.6, 0.55], 0.01, 1)}
    store_finished_letters_runs(cluster.workdir / "runs", runs)
    cluster.add_node(0.0)
    coordinator = cluster.start_coordinator(2, "--dashboard-port", "0")
    url = coordinator.wait_for(r"dashboard at (http://127\.0\.0\.1:\d+/)").group(1)

    browser.get(url)
    until("the runs are listed", lambda: len(browser.find_elements(
        By.CSS_SELECTOR, "#runs tbody tr")) == 3)
    assert not browser.find_element(By.ID, "compare-link").is_displayed()
    for run_id in runs:  # ticks survive the list's redraw every second
        click(browser, f"input[aria-label='compare {run_id}']")
    browser.find_element(By.ID, "compare-link").click()
    assert browser.current_url == f"{url}compare?runs=fast-s1,fast-s2,slow-s1"
    until("both settings are in the table", lambda: len(browser.find_elements(
        By.CSS_SELECTOR, "#settings tbody tr")) == 2)
    rows = texts(browser, "#settings tbody tr")
    assert rows[0].startswith("eta=0.1 2 0.2750 ± 0.0354"), rows  # best final first
    assert rows[1].startswith("eta=0.01 1 0.5500"), rows
    until("the first setting's curves are drawn",
          lambda: series_pixels(browser, "#chart-validation-error-against-rounds") > 0)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#charts canvas")) == 4

    browser.get(f"{url}compare?runs=fast-s1,gone")
    until("a run without a folder is named", lambda: browser.find_element(
        By.ID, "problem").text == "404 gone: no such run folder on this coordinator")


def store_finished_letters_runs(run_root: Path, runs: dict) -> None:
    """Completed runs as a coordinator leaves them: in the run store, and folders with
    run.json and metrics.jsonl (what the comparison reads)."""
    run_root.mkdir(parents=True, exist_ok=True)
    with RunStore(run_root / "runs.db") as store:
        for run_id, (errors, eta, seed) in runs.items():
            run_folder(run_root, run_id, errors, eta=eta, seed=seed)
            store.create_run(run_id, algorithm="delta_avg", model="mlp", dataset="letters",
                             rounds=len(errors))
            for index, error in enumerate(errors, 1):
                store.record_round(run_id, index, validation_error=error,
                                   validation_loss=error, train_loss=error, seconds=1.5,
                                   completed_units=11, discarded_units=0)
            store.end_run(run_id, "completed")
