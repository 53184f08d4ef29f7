// A run's page: progress, a chart per metric, sample grids, nodes, federated clients and
// unfinished units.
"use strict";

const runId = decodeURIComponent(location.pathname.split("/").pop());
const charts = {};  // title -> {plot, names}
let sampleRounds = [];
let followLatest = true;

// Which series each chart shows; metrics the run writes beyond these get a chart each.
const GROUPS = [
  ["Validation error", ["validation_error"]],
  ["Loss", ["validation_loss", "train_loss"]],
  ["Inception score", ["inception_score"]],
  ["FID", ["fid_features", "fid_logits"]],
  ["Bytes per round", ["bytes_down", "bytes_up"]],
  ["Units per second", ["units_per_second"]],
  ["Round time (s)", ["seconds"]],
  // a private run (docs/privacy.md): the budget spent after each round, and the clip in force
  ["Privacy spent (epsilon)", ["epsilon"]],
  // federated evaluation (clients.eval_every): the worst 10 % first, so that the means,
  // which are often close to each other, are not drawn over it
  ["Clients' validation accuracy", ["client_val_accuracy_worst10", "client_val_accuracy_mean",
                                    "federated_val_accuracy"]],
];
const NOT_CHARTED = new Set(["round", "n", "eval_round"]);

function chartGroups(rounds) {
  const names = Object.keys(rounds).filter(n => !NOT_CHARTED.has(n));
  const hasValues = n => (rounds[n] || []).some(v => v !== null);
  const groups = [];
  const used = new Set();
  for (const [title, members] of GROUPS) {
    const present = members.filter(hasValues);
    members.forEach(m => used.add(m));
    if (present.length) groups.push([title, present]);
  }
  // Where each round's time went (engine/phase_clock.py): one chart for them all.
  const phases = names.filter(n => n.startsWith("phase_") && hasValues(n));
  phases.forEach(n => used.add(n));
  if (phases.length) groups.push(["Round phases (s)", phases]);
  for (const n of names) if (!used.has(n) && hasValues(n)) groups.push([n, [n]]);
  return groups;
}

function drawChart(title, names, rounds) {
  const data = [rounds.round, ...names.map(n => rounds[n])];
  placeChart(charts, title, names, data, box => new uPlot(chartOptions(box, title, names, rounds), data, box));
}

function chartOptions(box, title, names, rounds) {
  return {
    width: Math.max(360, box.clientWidth - 12), height: 200,
    scales: {x: {time: false}, y: {range: yRange}},
    axes: [{label: "round", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 100000]},
           {size: 72, values: (u, vals) => vals.map(v => title.startsWith("Bytes") ? fmtBytes(v) : fmtNumber(v, 3))}],
    series: [{label: "round"}, ...names.map((n, i) => ({label: n, stroke: COLORS[i % COLORS.length],
      width: 2, spanGaps: true, points: {show: measured(rounds[n]) < MANY_POINTS}}))],
  };
}

// A series with few values shows them as points too: a value measured once has no line.
const MANY_POINTS = 60;
function measured(values) { return values.filter(v => v !== null).length; }

// uPlot's own range of a flat series is 0..100; a flat series gets a band around its value.
function yRange(u, min, max) {
  if (min === null || max === null) return [0, 1];
  if (min === max) { const pad = Math.abs(min) * 0.1 || 0.1; return [min - pad, max + pad]; }
  return uPlot.rangeNum(min, max, 0.1, true);
}


function renderSummary(view) {
  const s = view.summary, p = view.progress;
  document.title = "Run " + s.run_id + " - trainer dashboard";
  document.getElementById("run-id").textContent = s.run_id;
  document.getElementById("run-state").replaceWith(Object.assign(stateBadge(s.state), {id: "run-state"}));
  document.getElementById("run-what").textContent =
      [s.algorithm, s.model, s.dataset].filter(Boolean).join(" / ") + (s.policy ? ", policy " + s.policy : "") +
      ", started " + fmtTime(s.started);
  document.getElementById("run-message").textContent = s.message || "";
  const cards = [["round", (s.round ?? 0) + " / " + (s.rounds ?? "?"), "run-round"],
                 ["wall time", fmtSeconds(s.wall_seconds), "run-wall"]];
  const last = s.final || {};
  if (last.validation_error !== undefined && last.validation_error !== null) cards.push(["validation error", fmtNumber(last.validation_error), "run-error"]);
  if (last.inception_score) cards.push(["IS", fmtNumber(last.inception_score), "run-is"]);
  if (last.fid_features) cards.push(["FID", fmtNumber(last.fid_features), "run-fid"]);
  if (last.epsilon !== undefined) cards.push(["privacy spent (epsilon)", fmtNumber(last.epsilon), "run-epsilon"]);
  if (p) {
    cards.push(["units done", p.units_done + " / " + p.units_total, "run-units"],
               ["rejected", p.rejected, "run-rejected"], ["failed", p.failed, "run-failed"],
               ["in flight", p.in_flight, "run-in-flight"], ["stale", p.stale, "run-stale"],
               ["cancelled", p.cancelled, "run-cancelled"],
               ["bytes down / up", fmtBytes(p.bytes_down) + " / " + fmtBytes(p.bytes_up), "run-bytes"]);
    if (p.train_loss !== null) cards.push(["training loss", fmtNumber(p.train_loss), "run-loss"]);
  }
  document.getElementById("cards").replaceChildren(...cards.map(([label, value, id]) =>
      el("div", {class: "card", id}, el("div", {class: "label"}, label), el("div", {class: "value"}, value))));
}

function renderNodes(nodes) {
  fillTable(document.querySelector("#nodes tbody"), nodes.map(n => ({node: n.node, cells: [
    [el("span", {}, n.node, n.pull ? el("span", {class: "pull"}, "(pull)") : "",
        n.note ? el("div", {class: "note"}, "left out: " + n.note) : "")],
    [stateBadge(n.state)],
    [n.accepted, "num"], [n.rejected, "num"], [n.delayed, "num"], [n.failed, "num"],
    [n.cancelled, "num"], [n.samples, "num"], [n.in_flight ?? "–", "num"],
    [n.last_heartbeat_seconds === null ? "–" : fmtSeconds(n.last_heartbeat_seconds) + " ago", "num"],
    [n.unit_seconds === null ? "–" : fmtSeconds(n.unit_seconds), "num"],
  ]})), n => n.node);
}

function renderClients(clients) {
  document.getElementById("clients-section").hidden = !clients || clients.length === 0;
  const fixed = v => (v === null || v === undefined) ? "–" : v.toFixed(4);
  fillTable(document.querySelector("#clients tbody"), (clients || []).map(c => ({client: c.client, cells: [
    [c.client], [c.trained, "num"], [c.dropped, "num"], [c.failed, "num"],
    [c.examples ?? "–", "num"], [fixed(c.loss_before), "num"], [fixed(c.train_loss), "num"],
    [c.last_round ?? "–", "num"], [c.evaluated ?? 0, "num"], [fixed(c.val_loss), "num"],
    [fixed(c.val_accuracy), "num"], [c.node || "–"],
  ]})), c => c.client);
}

function renderUnfinished(units, ledger) {
  fillTable(document.querySelector("#unfinished tbody"), units.map(u => ({key: u.round + "/" + u.unit_id, cells: [
    [u.round, "num"], [u.unit_id], [u.status], [u.node || "–"], [fmtSeconds(u.age_seconds), "num"],
    [u.attempts, "num"], [u.failures, "num"], [u.last_reason || ""],
  ]})), u => u.key);
  document.getElementById("no-unfinished").hidden = units.length > 0;
  document.getElementById("ledger").textContent = Object.entries(ledger || {})
      .filter(([, n]) => n > 0).map(([status, n]) => status + " " + n).join(", ");
}

function renderSamples(rounds) {
  document.getElementById("samples-section").hidden = rounds.length === 0;
  if (!rounds.length || rounds.join() === sampleRounds.join()) return;
  sampleRounds = rounds;
  const slider = document.getElementById("sample-slider");
  slider.max = rounds.length - 1;
  if (followLatest) slider.value = rounds.length - 1;
  showSample();
}

function showSample() {
  const slider = document.getElementById("sample-slider");
  const round = sampleRounds[Number(slider.value)];
  document.getElementById("sample").src = "/api/runs/" + encodeURIComponent(runId) + "/samples/" + round;
  document.getElementById("sample-caption").textContent =
      "round " + round + " (" + (Number(slider.value) + 1) + " of " + sampleRounds.length + " grids)";
}

document.getElementById("sample-slider").addEventListener("input", event => {
  followLatest = Number(event.target.value) === sampleRounds.length - 1;
  showSample();
});

poll("/api/runs/" + encodeURIComponent(runId), view => {
  renderSummary(view);
  for (const [title, names] of chartGroups(view.rounds)) drawChart(title, names, view.rounds);
  renderSamples(view.samples);
  renderNodes(view.nodes);
  renderClients(view.clients);
  renderUnfinished(view.unfinished, view.ledger);
});
