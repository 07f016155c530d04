// headlens report: sortable tables, the label table's switch and the attention viewer. Plain
// JavaScript, no network. User text only ever reaches the page through textContent, never innerHTML.
"use strict";
// Runs after viewer_core.js (msg, shownToken, tokenSpan, paintTokenWeights, drawStrip), which the report
// and the notebook views put first.

(function labelSwitch() {
  // "with a role / all heads": hides the rows of heads without a role (first-token sinks only, or
  // nothing). Without JavaScript the fieldset stays hidden and the whole (roles-first) table shows.
  var fieldset = document.getElementById("label-switch");
  var tableEl = document.getElementById("label-table");
  if (!fieldset || !tableEl) { return; }
  var radios = fieldset.querySelectorAll("input[name=label-view]");
  function apply() {
    var only = fieldset.querySelector("input[name=label-view]:checked").value === "labelled";
    tableEl.querySelectorAll("tbody tr:not(.labelled)").forEach(function (row) { row.hidden = only; });
  }
  radios.forEach(function (radio) { radio.addEventListener("change", apply); });
  if (tableEl.querySelectorAll("tbody tr.labelled").length > 0) { fieldset.hidden = false; }
  apply();
})();

(function headPanel() {
  // The head map's cells open the head's panel below the map: its roles, the scores that earned them beside
  // their cut-offs, how stable each label is, its direct effects, its circuit edges (text the page wrote in
  // its language, #head-facts) and a copy of its pattern thumbnail when the page draws one.
  // Enter on a focused cell does the same.
  var factsEl = document.getElementById("head-facts");
  var panel = document.getElementById("head-panel");
  if (!factsEl || !panel) { return; }
  var facts = JSON.parse(factsEl.textContent);
  // A titled list; an item is its text, or [text, borderline] (a borderline label's line gets the class).
  function list(title, items) {
    if (!items || !items.length) { return; }
    var h = document.createElement("h4"); h.textContent = title; panel.appendChild(h);
    var ul = document.createElement("ul");
    items.forEach(function (item) {
      var li = document.createElement("li"), pair = Array.isArray(item);
      li.textContent = pair ? item[0] : item;
      if (pair && item[1]) { li.className = "borderline"; }
      ul.appendChild(li);
    });
    panel.appendChild(ul);
  }
  function open(head) {
    var found = facts[head];
    if (!found) { return; }
    panel.textContent = "";
    panel.setAttribute("data-head", head);
    var title = document.createElement("h3"); title.textContent = msg("panel_head", { head: head });
    var close = document.createElement("button"); close.type = "button"; close.textContent = msg("panel_close");
    close.addEventListener("click", function () { panel.hidden = true; });
    title.appendChild(document.createTextNode(" ")); title.appendChild(close);
    panel.appendChild(title);
    list(msg("panel_roles"), found.roles.length ? found.roles : [msg("panel_none")]);
    list(msg("panel_scores"), found.scores);
    list(msg("panel_stability"), found.stability);
    list(msg("panel_direct"), found.direct);
    list(msg("panel_edges"), found.edges);
    var thumb = document.querySelector('figure.thumb[data-head="' + head + '"] img');
    if (thumb) {
      var h = document.createElement("h4"); h.textContent = msg("panel_pattern"); panel.appendChild(h);
      var img = thumb.cloneNode(false); img.className = "panel-thumb"; panel.appendChild(img);
    }
    panel.hidden = false;
    document.querySelectorAll("#head-map g[data-head]").forEach(function (g) {
      g.classList.toggle("chosen", g.getAttribute("data-head") === head);
    });
  }
  document.querySelectorAll("#head-map g[data-head]").forEach(function (g) {
    var head = g.getAttribute("data-head");
    g.addEventListener("click", function () { open(head); });
    g.addEventListener("keydown", function (e) { if (e.key === "Enter") { open(head); } });
  });
})();

(function sortableTables() {
  document.querySelectorAll("table.sortable").forEach(function (tableEl) {
    var headers = tableEl.querySelectorAll("thead th");
    headers.forEach(function (th, column) {
      th.tabIndex = 0;
      th.title = msg("sort_title") + (th.title ? " (" + th.title + ")" : "");
      var ascending = true;
      function sortRows() {
        var body = tableEl.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = a.cells[column].getAttribute("data-sort");
          var y = b.cells[column].getAttribute("data-sort");
          var nx = parseFloat(x), ny = parseFloat(y);
          var cmp = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
          return ascending ? cmp : -cmp;
        });
        rows.forEach(function (row) { body.appendChild(row); });
        headers.forEach(function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        ascending = !ascending;
      }
      th.addEventListener("click", sortRows);
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") { sortRows(); } });
    });
  });
})();

// The viewer whose elements have the ids viewer-data, viewer-app, ... followed by `suffix`: a report holds
// one (suffix ""); a notebook page may hold several, each with its own suffix (headlens.reports.inline).
(function zoomClose() {
  // An enlarged pattern (a checked .zoom-toggle) closes on Escape or on a click anywhere outside it.
  function close(except) {
    var toggles = document.querySelectorAll(".zoom-toggle");
    for (var i = 0; i < toggles.length; i++) { if (toggles[i] !== except) { toggles[i].checked = false; } }
  }
  document.addEventListener("keydown", function (e) { if (e.key === "Escape") { close(null); } });
  document.addEventListener("click", function (e) {
    var label = e.target.closest ? e.target.closest("label.zoom") : null;
    close(label ? label.querySelector(".zoom-toggle") : null);
  });
})();

function attentionViewer(suffix) {
  var dataEl = document.getElementById("viewer-data" + suffix);
  if (!dataEl) { return; }
  var data = JSON.parse(dataEl.textContent);
  var raw = atob(data.patterns_b64);
  var weights = new Uint8Array(raw.length);
  for (var i = 0; i < raw.length; i++) { weights[i] = raw.charCodeAt(i); }
  var P = data.pos, H = data.n_heads, L = data.n_layers;
  var app = document.getElementById("viewer-app" + suffix);
  var tokensEl = document.getElementById("viewer-tokens" + suffix);
  var gridEl = document.getElementById("viewer-grid" + suffix);
  var headSelect = document.getElementById("viewer-head" + suffix);
  var statusEl = document.getElementById("viewer-status" + suffix);
  var state = { query: P - 1, layer: 0, head: 0 };
  var parts = String(data.default_head).split(".");
  state.layer = parseInt(parts[0], 10) || 0;
  state.head = parseInt(parts[1], 10) || 0;

  // Weight (0..1) of head (layer, head) from query q to key k.
  function weight(layer, head, q, k) {
    return weights[((layer * H + head) * P + q) * P + k] / 255;
  }
  // Head (layer, head)'s weights from the query to keys 0..query.
  function keyWeights(layer, head) {
    var out = [];
    for (var k = 0; k <= state.query; k++) { out.push(weight(layer, head, state.query, k)); }
    return out;
  }

  var tokenEls = data.tokens.map(function (token, pos) {
    var span = tokenSpan(token, pos, function (chosen) { state.query = chosen; draw(); });
    tokensEl.appendChild(span);
    return span;
  });

  for (var l = 0; l < L; l++) {
    for (var h = 0; h < H; h++) {
      var option = document.createElement("option");
      var name = l + "." + h;
      option.value = name;
      option.textContent = data.labels[name] ? name + " (" + data.labels[name] + ")" : name;
      headSelect.appendChild(option);
    }
  }
  headSelect.addEventListener("change", function () {
    var p = headSelect.value.split(".");
    state.layer = parseInt(p[0], 10); state.head = parseInt(p[1], 10); draw();
  });

  // About 1000 px for a row of heads; at least one pixel per token. Heads that do not fit in one row wrap into
  // further blocks of rows (heads 0-4, then 5-7), so the grid never runs past the page.
  var cellWidth = Math.max(1, Math.floor(Math.floor(1000 / H) / P));
  var perRow = Math.max(1, Math.min(H, Math.floor(1000 / (P * cellWidth))));
  var canvases = [];
  for (var l0 = 0; l0 < L; l0++) { canvases.push([]); }
  for (var first = 0; first < H; first += perRow) {
    var last = Math.min(H, first + perRow);
    var grid = document.createElement("table");
    grid.className = "viewer-grid";
    var headRow = grid.insertRow();
    headRow.appendChild(document.createElement("th"));
    for (var hh = first; hh < last; hh++) {
      var th = document.createElement("th"); th.textContent = msg("grid_head", { head: hh }); headRow.appendChild(th);
    }
    for (var ll = 0; ll < L; ll++) {
      var row = grid.insertRow();
      var rowHead = document.createElement("th"); rowHead.textContent = msg("grid_layer", { layer: ll });
      row.appendChild(rowHead);
      for (var hc = first; hc < last; hc++) {
        var cell = row.insertCell();
        var canvas = document.createElement("canvas");
        canvas.width = P * cellWidth; canvas.height = 12;
        canvas.title = ll + "." + hc + (data.labels[ll + "." + hc] ? " " + data.labels[ll + "." + hc] : "");
        canvas.setAttribute("data-head", ll + "." + hc);
        canvas.addEventListener("click", (function (a, b) {
          return function () { state.layer = a; state.head = b; draw(); };
        })(ll, hc));
        cell.appendChild(canvas);
        canvases[ll][hc] = canvas;
      }
    }
    gridEl.appendChild(grid);
  }

  function draw() {
    var found = paintTokenWeights(tokenEls, keyWeights(state.layer, state.head), state.query);
    for (var a = 0; a < L; a++) {
      for (var b = 0; b < H; b++) {
        drawStrip(canvases[a][b], keyWeights(a, b), cellWidth);
        canvases[a][b].className = a === state.layer && b === state.head ? "chosen" : "";
      }
    }
    headSelect.value = state.layer + "." + state.head;
    statusEl.textContent = msg("status", {
      query: state.query, query_token: shownToken(data.tokens[state.query]), head: state.layer + "." + state.head,
      best: found.best, best_token: shownToken(data.tokens[found.best]), weight: num(found.weight) });
  }

  app.hidden = false;
  draw();
}
attentionViewer("");
