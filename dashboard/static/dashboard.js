// Shared helpers of the dashboard pages: polling the JSON API and formatting values.
"use strict";

const POLL_MS = 1000;
const COLORS = ["#2f6fdd", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c",
                "#5c940d"];

// Calls render(data) with the answer of `url` now and every POLL_MS, one request at a time;
// an answer the request itself is refused with (400, 404) goes to refused(text), if given.
function poll(url, render, refused) {
  let busy = false;
  async function tick() {
    if (busy) return;
    busy = true;
    try {
      const response = await fetch(url, {cache: "no-store", credentials: "same-origin"});
      if (response.status === 401) { location.href = "/login?next=" + encodeURIComponent(location.pathname); return; }
      if (refused && (response.status === 400 || response.status === 404)) {
        refused((await response.text()).trim());
        return;
      }
      if (!response.ok) throw new Error(response.status + " " + response.statusText);
      render(await response.json());
      document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (error) {
      document.getElementById("updated").textContent = "cannot reach the coordinator (" + error.message + ")";
    } finally {
      busy = false;
    }
  }
  tick();
  setInterval(tick, POLL_MS);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function stateBadge(state) {
  return el("span", {class: "state state-" + state}, state);
}

function fmtNumber(v, digits = 4) {
  if (v === null || v === undefined) return "–";
  if (Number.isInteger(v)) return String(v);
  return Math.abs(v) >= 1000 ? v.toFixed(0) : v.toPrecision(digits);
}

function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  // units of a few ms are common: under a second, milliseconds (never "0.0 s")
  if (s < 0.001) return s > 0 ? "< 1 ms" : "0 s";
  if (s < 1) return (s < 0.01 ? (s * 1000).toFixed(1) : Math.round(s * 1000)) + " ms";
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function fmtTime(epochSeconds) {
  return epochSeconds ? new Date(epochSeconds * 1000).toLocaleString() : "–";
}

// Replaces the rows of a table body; each row is a list of [text or node, class].
function fillTable(tbody, rows, key) {
  tbody.replaceChildren(...rows.map(row => {
    const tr = el("tr", key ? {"data-key": key(row)} : {});
    for (const [value, cls] of row.cells) tr.append(el("td", cls ? {class: cls} : {}, value));
    return tr;
  }));
}

function slug(text) { return text.toLowerCase().replace(/[^a-z0-9]+/g, "-"); }

// The chart `title` in #charts (`charts`: title -> {plot, names}): given new data in place
// when it shows the same series, else made again by make(box), which returns the plot
// (or nothing, for a chart with nothing to show yet).
function placeChart(charts, title, names, data, make) {
  const existing = charts[title];
  if (existing && existing.names.join() === names.join()) {
    existing.plot.setData(data);
    return;
  }
  if (existing) existing.plot.destroy();
  delete charts[title];
  const box = document.getElementById("chart-" + slug(title)) ||
      document.getElementById("charts").appendChild(
          el("div", {class: "chart", id: "chart-" + slug(title), "data-title": title}, el("h3", {}, title)));
  const plot = make(box);
  if (plot) charts[title] = {plot, names};
}
