// The runs page: every run the coordinator knows, live ones first, redrawn every second.
"use strict";

// The last round's metrics shown in columns of their own (index.html names them); the
// run's page charts them all.
const FINAL_COLUMNS = ["validation_error", "train_loss", "inception_score", "fid_features"];

const selected = new Set();  // runs ticked for the comparison page, kept across redraws

function compareBox(runId) {
  const box = el("input", {type: "checkbox", class: "compare", "aria-label": "compare " + runId});
  box.checked = selected.has(runId);
  box.addEventListener("change", () => {
    if (box.checked) selected.add(runId); else selected.delete(runId);
    showCompareLink();
  });
  return box;
}

function showCompareLink() {
  const link = document.getElementById("compare-link");
  link.hidden = selected.size === 0;
  document.getElementById("compare-hint").hidden = selected.size > 0;
  link.href = "/compare?runs=" + [...selected].map(encodeURIComponent).join(",");
}

poll("/api/runs", data => {
  const tbody = document.querySelector("#runs tbody");
  const rows = data.runs.map(run => ({run_id: run.run_id, cells: [
    [compareBox(run.run_id)],
    [el("a", {href: "/runs/" + encodeURIComponent(run.run_id)}, run.run_id)],
    [stateBadge(run.state)],
    [run.algorithm], [run.model],
    [(run.round ?? 0) + " / " + (run.rounds ?? "?"), "num"],
    [fmtTime(run.started)],
    [fmtSeconds(run.wall_seconds), "num"],
    ...FINAL_COLUMNS.map(name => [fmtNumber((run.final || {})[name]), "num"]),
    [run.message || ""],
  ]}));
  fillTable(tbody, rows, r => r.run_id);
  document.getElementById("no-runs").hidden = data.runs.length > 0;
  // coordinators sharing a PostgreSQL store: who leads (a standby's page is read-only)
  const leader = document.getElementById("leader");
  leader.hidden = !data.leader;
  leader.textContent = data.leader ? "Run store: " + data.leader : "";
});
