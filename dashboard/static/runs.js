// The runs page: every run the coordinator knows, live ones first, redrawn every second.
"use strict";

function finalMetrics(final) {
  const parts = [];
  for (const [name, value] of Object.entries(final || {})) {
    if (typeof value !== "number" || name === "n") continue;
    parts.push(name.startsWith("bytes") ? name + " " + fmtBytes(value) : name + " " + fmtNumber(value));
  }
  return parts.join(", ");
}

poll("/api/runs", data => {
  const tbody = document.querySelector("#runs tbody");
  const rows = data.runs.map(run => ({run_id: run.run_id, cells: [
    [el("a", {href: "/runs/" + encodeURIComponent(run.run_id)}, run.run_id)],
    [stateBadge(run.state)],
    [run.algorithm], [run.model],
    [(run.round ?? 0) + " / " + (run.rounds ?? "?"), "num"],
    [fmtTime(run.started)],
    [fmtSeconds(run.wall_seconds), "num"],
    [finalMetrics(run.final)],
    [run.message || ""],
  ]}));
  fillTable(tbody, rows, r => r.run_id);
  document.getElementById("no-runs").hidden = data.runs.length > 0;
});
