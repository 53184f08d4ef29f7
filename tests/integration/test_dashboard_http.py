"""The coordinator's dashboard over plain HTTP requests: the token it asks for, HTTPS with
the Thrift port's certificate, the JSON API and the Prometheus /metrics of a real run."""

from __future__ import annotations

import dataclasses
import http.client
import json
import re
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest

from devtools import local_cluster as procs
from tests.conftest import Cluster
from tests.programs import missing_commands, require
from tests.tls_certs import make_certs

TOKEN = "dashboard-token-5678"
RUN = "watched"
ROUNDS = 2
ROWS_PER_ROUND = 11 * 1500  # a letters round: 11 units of 1,500 rows


@dataclass
class Dashboard:
    cluster: Cluster
    port: int
    tls: ssl.SSLContext
    server_flags: list[str]

    def get(self, path: str, headers: dict[str, str] | None = None, method: str = "GET",
            body: str | None = None) -> tuple[int, http.client.HTTPResponse, str]:
        """(status, response, text) without following redirects."""
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.tls,
                                                 timeout=10)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response, response.read().decode()
        finally:
            connection.close()

    def bearer(self, token: str = TOKEN) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """A coordinator with a token, TLS and a dashboard, after a two-round run."""
    workdir = tmp_path_factory.mktemp("dashboard")
    token_file = workdir / "trainer.token"
    token_file.write_text(TOKEN + "\n")
    certs = make_certs(workdir / "certs")
    flags = ["--token-file", str(token_file), "--tls-ca", str(certs.ca)]
    server_flags = [*flags, "--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    cluster = Cluster(workdir)
    try:
        cluster.add_node(0.0, *server_flags)
        port = _start_coordinator(cluster, server_flags)
        cluster.train_json("letters", str(ROUNDS), "2", "20", "0.0001", "--run-id", RUN,
                           *flags)
        yield Dashboard(cluster, port, ssl.create_default_context(cafile=str(certs.ca)),
                        server_flags)
    finally:
        cluster.stop()


def _start_coordinator(cluster: Cluster, server_flags: list[str]) -> int:
    """Start the cluster's coordinator with a dashboard; the dashboard's port."""
    return _dashboard_port(cluster.start_coordinator(2, *server_flags, "--dashboard-port", "0"))


def _dashboard_port(coordinator: procs.Proc) -> int:
    return int(coordinator.wait_for(r"dashboard at https://127\.0\.0\.1:(\d+)/").group(1))


@pytest.mark.parametrize("path", ["/api/runs", f"/api/runs/{RUN}", "/metrics",
                                  f"/api/runs/{RUN}/samples/1", f"/api/compare?runs={RUN}"])
def test_data_is_refused_without_the_token(dashboard: Dashboard, path: str) -> None:
    for headers in ({}, dashboard.bearer("wrong"), {"Cookie": "trainer_dashboard=forged"}):
        status, _, text = dashboard.get(path, headers)
        assert status == 401, (path, headers)
        assert RUN not in text


def test_a_page_without_the_token_sends_the_browser_to_the_login_form(
        dashboard: Dashboard) -> None:
    status, response, _ = dashboard.get(f"/runs/{RUN}")
    assert status == 303
    assert response.getheader("Location") == "/login?" + urlencode({"next": f"/runs/{RUN}"})
    status, _, form = dashboard.get("/login")
    assert status == 200 and 'name="token"' in form


def test_the_login_form_sets_a_cookie_that_opens_the_api(dashboard: Dashboard) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, response, _ = dashboard.get("/login", form, "POST",
                                        urlencode({"token": "wrong", "next": "/"}))
    assert status == 401 and response.getheader("Set-Cookie") is None
    status, response, _ = dashboard.get("/login", form, "POST",
                                        urlencode({"token": TOKEN, "next": f"/runs/{RUN}"}))
    assert status == 303 and response.getheader("Location") == f"/runs/{RUN}"
    cookie = response.getheader("Set-Cookie")
    assert "HttpOnly" in cookie and "Secure" in cookie and TOKEN not in cookie
    status, _, text = dashboard.get("/api/runs", {"Cookie": cookie.split(";")[0]})
    assert status == 200
    assert [r["run_id"] for r in json.loads(text)["runs"]] == [RUN]
    for elsewhere in ("//example.org/", "https://example.org/"):  # only this site's paths
        status, response, _ = dashboard.get("/login", form, "POST",
                                            urlencode({"token": TOKEN, "next": elsewhere}))
        assert status == 303 and response.getheader("Location") == "/"


def test_a_token_in_the_address_signs_in_once_and_is_dropped_from_it(
        dashboard: Dashboard) -> None:
    status, response, _ = dashboard.get(f"/runs/{RUN}?token={TOKEN}")
    assert status == 303 and response.getheader("Location") == f"/runs/{RUN}"
    cookie = response.getheader("Set-Cookie").split(";")[0]
    status, _, page = dashboard.get(f"/runs/{RUN}", {"Cookie": cookie})
    assert status == 200 and "uPlot" in page
    assert dashboard.get("/api/runs?token=wrong")[0] == 401


def test_the_dashboard_is_read_only(dashboard: Dashboard) -> None:
    status, _, _ = dashboard.get("/api/runs", dashboard.bearer(), "POST", "{}")
    assert status == 405


def test_the_run_api_has_every_round_its_nodes_and_units(dashboard: Dashboard) -> None:
    status, _, text = dashboard.get(f"/api/runs/{RUN}", dashboard.bearer())
    assert status == 200
    view = json.loads(text)
    assert view["summary"]["state"] == "completed" and view["summary"]["round"] == ROUNDS
    rounds = view["rounds"]
    assert rounds["round"] == list(range(1, ROUNDS + 1))
    for name in ("validation_error", "validation_loss", "train_loss", "units_per_second",
                 "bytes_down", "bytes_up"):
        assert len(rounds[name]) == ROUNDS and all(v is not None for v in rounds[name]), name
    assert all(v > 0 for v in rounds["bytes_down"])
    assert sum(rounds["bytes_down"]) == view["progress"]["bytes_down"]
    [node] = view["nodes"]
    assert node["node"] == f"127.0.0.1:{dashboard.cluster.nodes[0].port}"
    assert node["accepted"] >= 11 * ROUNDS and node["pull"] is False  # backups count too
    assert node["state"] == "alive"  # as it was when the run ended
    assert node["samples"] >= ROUNDS * ROWS_PER_ROUND  # backups' rows count too
    assert view["unfinished"] == [] and view["ledger"]["completed"] == 11 * ROUNDS
    assert dashboard.get("/api/runs/nothing-here", dashboard.bearer())[0] == 404


def test_the_compare_api_gives_the_runs_table_and_curves(dashboard: Dashboard) -> None:
    status, _, text = dashboard.get(f"/api/compare?runs={RUN}", dashboard.bearer())
    assert status == 200, text
    view = json.loads(text)
    [setting] = view["settings"]
    assert setting["runs"] == [RUN]
    [run] = view["runs"]
    assert run["round"] == list(range(1, ROUNDS + 1))
    assert run["validation_error"][-1] == pytest.approx(setting["final"])
    assert run["mib"][-1] == pytest.approx(setting["mib"]) and setting["mib"] > 0
    assert dashboard.get("/api/compare?runs=", dashboard.bearer())[0] == 400
    status, _, text = dashboard.get(f"/api/compare?runs={RUN},gone", dashboard.bearer())
    assert (status, text) == (404, "404 gone: no such run folder on this coordinator\n")


def _value(metrics: str, series: str) -> float:
    match = re.search(rf"^{re.escape(series)} (\S+)$", metrics, re.MULTILINE)
    assert match, f"no {series} in:\n{metrics}"
    return float(match.group(1))


def test_metrics_describe_the_run_nodes_wire_and_rpc_latency(dashboard: Dashboard) -> None:
    status, response, metrics = dashboard.get("/metrics", dashboard.bearer())
    assert status == 200 and response.getheader("Content-Type").startswith("text/plain")
    node = f"127.0.0.1:{dashboard.cluster.nodes[0].port}"
    assert _value(metrics, f'trainer_run_round{{run="{RUN}"}}') == ROUNDS
    assert _value(metrics, f'trainer_run_state{{run="{RUN}",state="completed"}}') == 1
    assert _value(metrics, f'trainer_run_units{{run="{RUN}",status="completed"}}') == 11 * ROUNDS
    assert _value(metrics, f'trainer_run_rejected_total{{run="{RUN}"}}') == 0
    assert _value(metrics, f'trainer_run_discarded_total{{run="{RUN}"}}') == 0
    assert 0 < _value(metrics, f'trainer_run_metric{{metric="validation_error",run="{RUN}"}}') < 1
    assert _value(metrics, f'trainer_node_units_total{{node="{node}",outcome="accepted"}}') >= \
        11 * ROUNDS
    assert _value(metrics, f'trainer_node_pull{{node="{node}"}}') == 0
    assert _value(metrics, 'trainer_wire_bytes_total{direction="sent",kind="call",'
                           'method="train_with_weights"}') > 0
    assert _value(metrics, 'trainer_rpc_seconds_count{method="train"}') == 1
    assert _value(metrics, 'trainer_rpc_seconds_bucket{le="+Inf",method="train"}') == 1
    assert "process_resident_memory_bytes" in metrics


def test_plain_http_is_refused_by_the_tls_dashboard(dashboard: Dashboard) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", dashboard.port, timeout=10)
    try:
        connection.request("GET", "/api/runs", headers=dashboard.bearer())
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            connection.getresponse()
    finally:
        connection.close()


def test_a_busy_dashboard_port_stops_the_coordinator_with_one_line(
        dashboard: Dashboard, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(procs.REPO / "coordinator_node.py"), "0", "2", "--host",
         "127.0.0.1", "--nodes-file", str(dashboard.cluster.workdir / "compute_nodes.txt"),
         "--run-dir", str(tmp_path / "runs"), "--dashboard-port", str(dashboard.port)],
        capture_output=True, text=True, timeout=60, env=procs.python_env())
    assert result.returncode == 1
    assert f"cannot serve the dashboard on 127.0.0.1:{dashboard.port}" in result.stderr


def test_runs_from_before_a_restart_are_listed_from_the_store(dashboard: Dashboard,
                                                             tmp_path: Path) -> None:
    """A coordinator started afresh on the store lists the run from before, from the store
    and the run's folder. It opens a copy of them, so the module's coordinator (which holds
    the store) serves the other tests unchanged, whatever their order."""
    shutil.copytree(dashboard.cluster.workdir / "runs", tmp_path / "runs")
    restarted = procs.start_coordinator(
        tmp_path, dashboard.cluster.workdir / "compute_nodes.txt", 2, *dashboard.server_flags,
        "--dashboard-port", "0", run_dir=tmp_path / "runs")
    try:
        _check_the_stored_run(dataclasses.replace(dashboard, port=_dashboard_port(restarted)))
    finally:
        restarted.stop()


def _check_the_stored_run(dashboard: Dashboard) -> None:
    status, _, text = dashboard.get("/api/runs", dashboard.bearer())
    assert status == 200
    [run] = json.loads(text)["runs"]
    assert (run["run_id"], run["live"], run["state"]) == (RUN, False, "completed")
    assert run["round"] == ROUNDS and run["algorithm"] == "delta_avg"
    assert 0 < run["final"]["validation_error"] < 1 and run["wall_seconds"] > 0
    view = json.loads(dashboard.get(f"/api/runs/{RUN}", dashboard.bearer())[2])
    assert view["progress"] is None  # no live progress: what the store and files hold
    assert view["rounds"]["round"] == list(range(1, ROUNDS + 1))
    assert all(v > 0 for v in view["rounds"]["bytes_up"])
    [node] = view["nodes"]
    assert node["node"] == f"127.0.0.1:{dashboard.cluster.nodes[0].port}"
    assert node["accepted"] >= 11 * ROUNDS and node["state"] == "alive"  # at the run's end
    assert node["samples"] >= ROUNDS * ROWS_PER_ROUND


FORMAT_SECONDS = """
const fs = require("fs");
eval(fs.readFileSync(process.argv[1], "utf8") + "\\nglobalThis.fmtSeconds = fmtSeconds;");
console.log(JSON.stringify(JSON.parse(process.argv[2]).map(fmtSeconds)));
"""


def test_the_pages_show_units_of_a_few_ms_in_ms_not_as_zero_seconds():
    """'typical unit 0.0 s' was shown for units of 20-50 ms."""
    require(missing_commands("node"), "apt-get install nodejs; scripts/setup.sh installs it")
    seconds = [0.0004, 0.0025, 0.02, 0.0456, 0.999, 1.5, 75]
    done = subprocess.run(["node", "-e", FORMAT_SECONDS,
                           str(procs.REPO / "dashboard" / "static" / "dashboard.js"),
                           json.dumps(seconds)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["< 1 ms", "2.5 ms", "20 ms", "46 ms", "999 ms",
                                       "1.5 s", "1 min 15 s"]
