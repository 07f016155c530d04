// headlens explore: the live page. Asks this server (same origin, JSON; the token travels in the cookie
// the first visit set) for each view, and shows a refusal's own message (a reply that is not JSON as its
// status); draws with the report viewer's shared functions (viewer_core.js: msg, shownToken, tokenSpan,
// paintTokenWeights, drawStrip, and num and pct for every number). User text only ever reaches the page
// through textContent, never innerHTML.
"use strict";

(function explorer() {
  var MODEL = JSON.parse(document.getElementById("explore-model").textContent);
  var L = MODEL.n_layers, H = MODEL.n_heads;
  var state = { run: null, tokens: [], layer: 0, head: null, query: null, ticked: {}, busy: 0 };
  var $ = function (id) { return document.getElementById(id); };

  function roleOf(name) {
    var labels = MODEL.labels[name] || [];
    for (var i = 0; i < labels.length; i++) { if (MODEL.roles.indexOf(labels[i]) >= 0) { return labels[i]; } }
    return null;
  }
  // a role's colour is the registry's (headlens.classify.kinds), as on the report's head map
  function colour(role) { return role === null ? "#bbb" : MODEL.colours[role]; }

  // -- talking to the server: the page says when it is working, and shows a refusal as one line ----------
  function setStatus(text, error) {
    $("status").textContent = text;
    $("status").className = error ? "note" : "";
  }
  function api(path, body) {
    state.busy += 1;
    setStatus(msg("x_working"));
    document.body.classList.add("busy");
    var init = body === undefined ? {} : {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
    return fetch(path, init).then(function (response) {
      return response.text().then(function (text) {
        var data = null;
        try { data = JSON.parse(text); } catch (ignored) { data = null; }
        if (data === null || typeof data !== "object") {
          throw new Error(msg("x_bad_reply", { status: response.status }));
        }
        if (!response.ok) { throw new Error(data.error || msg("x_bad_reply", { status: response.status })); }
        return data;
      });
    }).finally(function () {
      state.busy -= 1;
      if (state.busy === 0) { document.body.classList.remove("busy"); }
    });
  }
  function fail(error) { setStatus(msg("x_error", { message: error.message }), true); }
  function idle(text) { if (state.busy === 0) { setStatus(text || ""); } }
  function bytes(b64) {
    var raw = atob(b64), out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { out[i] = raw.charCodeAt(i); }
    return out;
  }

  // -- a pattern as pixels: the first column (where sinks park attention) red on 0..1, the rest scaled to
  //    their own maximum (black -> orange -> yellow) -----------------------------------------------------
  function paintPattern(canvas, data, offset, n) {
    var ctx = canvas.getContext("2d"), image = ctx.createImageData(n, n), top = 0;
    for (var q = 0; q < n; q++) { for (var k = 1; k <= q; k++) { top = Math.max(top, data[offset + q * n + k]); } }
    for (var qq = 0; qq < n; qq++) {
      for (var kk = 0; kk < n; kk++) {
        var v = data[offset + qq * n + kk], p = 4 * (qq * n + kk), w;
        if (kk === 0) {
          w = v / 255;
          image.data[p] = 255; image.data[p + 1] = Math.round(255 * (1 - w)); image.data[p + 2] = Math.round(255 * (1 - w));
        } else {
          w = top > 0 ? Math.pow(v / top, 0.7) : 0;
          image.data[p] = Math.round(255 * Math.min(1, 1.6 * w)); image.data[p + 1] = Math.round(210 * w * w);
          image.data[p + 2] = Math.round(40 * w);
        }
        image.data[p + 3] = kk > qq ? 40 : 255;
      }
    }
    ctx.putImageData(image, 0, 0);
  }

  // -- the grid: one cell per head, bordered by its role, ticked for removal -----------------------------
  var cells = {};
  function buildGrid() {
    var grid = $("grid");
    grid.textContent = "";
    cells = {};
    var table = document.createElement("table");
    table.className = "explore-grid";
    for (var l = 0; l < L; l++) {
      var row = table.insertRow();
      var th = document.createElement("th");
      th.textContent = msg("grid_layer", { layer: l });
      row.appendChild(th);
      for (var h = 0; h < H; h++) { row.insertCell().appendChild(makeCell(l, h)); }
    }
    grid.appendChild(table);
  }
  function makeCell(l, h) {
    var name = l + "." + h, role = roleOf(name);
    var cell = document.createElement("div");
    cell.className = "cell";
    cell.setAttribute("data-head", name);
    var canvas = document.createElement("canvas");
    canvas.className = "thumb-canvas";
    canvas.width = 1; canvas.height = 1;
    canvas.style.borderColor = colour(role);
    canvas.title = name + " " + ((MODEL.labels[name] || []).join(", ") || msg("x_no_role"));
    canvas.addEventListener("click", function () { openHead(l, h); });
    var label = document.createElement("label");
    var tick = document.createElement("input");
    tick.type = "checkbox"; tick.className = "tick"; tick.setAttribute("data-head", name);
    tick.checked = !!state.ticked[name];
    tick.addEventListener("change", function () {
      if (tick.checked) { state.ticked[name] = true; } else { delete state.ticked[name]; }
      showTicked();
    });
    label.appendChild(tick);
    label.appendChild(document.createTextNode(name));
    cell.appendChild(canvas);
    cell.appendChild(label);
    cells[name] = { cell: cell, canvas: canvas, tick: tick };
    return cell;
  }
  function showTicked() {
    var names = Object.keys(state.ticked);
    $("ticked").textContent = names.length ? msg("x_ticked", { n: names.length, heads: names.join(", ") }) : "";
  }
  function applyFilter() {
    var role = $("role-filter").value;
    Object.keys(cells).forEach(function (name) {
      var show = !role || (MODEL.labels[name] || []).indexOf(role) >= 0;
      cells[name].cell.classList.toggle("filtered-out", !show);
    });
  }
  function loadLayers(run, layer) {
    if (run !== state.run || layer >= L) {
      if (run === state.run) { idle(msg("x_done", { n: state.tokens.length, n_layers: L, n_heads: H })); }
      return;
    }
    setStatus(msg("x_ready", { n: state.tokens.length, layer: layer + 1, n_layers: L }));
    api("/api/layer?run=" + encodeURIComponent(run) + "&layer=" + layer).then(function (data) {
      if (run !== state.run) { return; }
      var thumbs = bytes(data.thumbs_b64), n = data.size;
      for (var h = 0; h < H; h++) {
        var canvas = cells[layer + "." + h].canvas;
        canvas.width = n; canvas.height = n;
        paintPattern(canvas, thumbs, h * n * n, n);
        canvas.setAttribute("data-loaded", "1");
      }
      loadLayers(run, layer + 1);
    }).catch(fail);
  }

  // -- the text: submitted, tokens shown, the grid loaded layer by layer ---------------------------------
  var tokenEls = [];
  $("text-form").addEventListener("submit", function (e) {
    e.preventDefault();
    api("/api/run", { text: $("text").value }).then(function (data) {
      state.run = data.run; state.tokens = data.tokens; state.query = null; state.head = null;
      tokenEls = data.tokens.map(function (token, pos) { return tokenSpan(token, pos, chooseToken); });
      $("tokens").textContent = "";
      tokenEls.forEach(function (span) { $("tokens").appendChild(span); });
      ["head-figure", "head-scores", "row-panel", "ablate-summary", "ablate-tokens", "top-before", "top-after",
       "direct-summary", "direct-map"].forEach(function (id) { $(id).textContent = ""; });
      $("main").hidden = false;
      buildGrid();
      applyFilter();
      loadLayers(data.run, 0);
    }).catch(fail);
  });

  // -- one head: full pattern with tokens on both axes, and its scores ------------------------------------
  function openHead(l, h) {
    state.layer = l; state.head = h;
    $("row-layer").value = String(l);
    Object.keys(cells).forEach(function (name) { cells[name].cell.classList.toggle("chosen", name === l + "." + h); });
    var run = state.run;
    api("/api/head?run=" + encodeURIComponent(run) + "&layer=" + l + "&head=" + h).then(function (data) {
      if (run !== state.run) { return; }
      drawHead(data);
      if (state.query !== null) { return refreshRow(); }
      idle();
    }).catch(fail);
  }
  function drawHead(data) {
    var n = data.pos, figure = $("head-figure"), weights = bytes(data.pattern_b64);
    figure.textContent = "";
    var title = document.createElement("h3");
    title.textContent = msg("x_head", { head: data.layer + "." + data.head }) + " — " +
      (data.labels.length ? msg("x_labels", { labels: data.labels.join(", ") }) : msg("x_no_role"));
    figure.appendChild(title);
    (data.backups || []).forEach(function (b) {
      var line = document.createElement("p");
      line.className = "backup-of";
      line.textContent = msg("x_backup", { role: b.role, task: b.task, compensation: num(b.compensation),
        p: num(b.p_value) });
      figure.appendChild(line);
    });
    var box = document.createElement("div");
    box.className = "head-box";
    var size = Math.max(3, Math.min(20, Math.floor(420 / n)));
    box.style.setProperty("--cell", size + "px");
    box.style.setProperty("--n", String(n));
    var xticks = document.createElement("div"), yticks = document.createElement("div");
    xticks.className = "xticks"; yticks.className = "yticks";
    state.tokens.forEach(function (token) {
      var x = document.createElement("span"), y = document.createElement("span");
      x.textContent = shownToken(token); y.textContent = shownToken(token);
      xticks.appendChild(x); yticks.appendChild(y);
    });
    var canvas = document.createElement("canvas");
    canvas.id = "head-canvas";
    canvas.width = n; canvas.height = n;
    paintPattern(canvas, weights, 0, n);
    canvas.addEventListener("mousemove", function (e) {
      var rect = canvas.getBoundingClientRect();
      var k = Math.floor((e.clientX - rect.left) / rect.width * n), q = Math.floor((e.clientY - rect.top) / rect.height * n);
      if (q >= 0 && q < n && k >= 0 && k <= q) {
        canvas.title = shownToken(state.tokens[q]) + " → " + shownToken(state.tokens[k]) + ": " +
          msg("weight", { weight: num(weights[q * n + k] / 255) });
      }
    });
    box.appendChild(xticks); box.appendChild(yticks); box.appendChild(canvas);
    figure.appendChild(box);
    var table = $("head-scores");
    table.textContent = "";
    var head = table.createTHead().insertRow();
    [msg("x_score"), msg("x_value")].forEach(function (text) {
      var th = document.createElement("th"); th.textContent = text; head.appendChild(th);
    });
    var body = table.createTBody();
    var intervals = data.intervals || {};
    Object.keys(data.scores).forEach(function (name) {
      var row = body.insertRow();
      row.insertCell().textContent = name;
      var span = intervals[name];  // its 95% bootstrap interval, where the classification has one
      row.insertCell().textContent = num(data.scores[name]) +
        (span ? " [" + num(span[0]) + ", " + num(span[1]) + "]" : "");
    });
    showStability(figure, data.stability || []);
  }
  // how stable each of the head's labels is: the share of resamples that kept it, its ranking score's 95%
  // interval, a borderline label marked (headlens.classify.stability)
  function showStability(figure, rows) {
    if (!rows.length) { return; }
    var title = document.createElement("h4");
    title.textContent = msg("panel_stability");
    var list = document.createElement("ul");
    list.className = "stability";
    rows.forEach(function (row) {
      var item = document.createElement("li");
      var text = msg("x_stability", { label: row.label, share: pct(row.share) });
      if (row.value !== null && row.low !== null && row.high !== null) {
        text += msg("x_interval", { score: row.score, value: num(row.value), low: num(row.low), high: num(row.high) });
      }
      if (row.borderline) { text += msg("x_borderline"); item.className = "borderline"; }
      item.textContent = text;
      item.setAttribute("data-label", row.label);
      list.appendChild(item);
    });
    figure.appendChild(title);
    figure.appendChild(list);
  }

  // -- one token: where every head of the chosen layer sends its attention -------------------------------
  function chooseToken(pos) {
    state.query = pos;
    refreshRow();
  }
  function refreshRow() {
    var run = state.run, layer = state.layer, query = state.query;
    return api("/api/row?run=" + encodeURIComponent(run) + "&layer=" + layer + "&q=" + query).then(function (data) {
      if (run !== state.run || query !== state.query || layer !== state.layer) { return; }
      var panel = $("row-panel");
      panel.textContent = "";
      var cellWidth = Math.max(1, Math.floor(900 / state.tokens.length));
      data.weights.forEach(function (weights, h) {
        var line = document.createElement("div");
        line.className = "strip";
        line.setAttribute("data-head", layer + "." + h);
        var name = document.createElement("span");
        name.textContent = layer + "." + h;
        name.style.color = colour(roleOf(layer + "." + h));
        var canvas = document.createElement("canvas");
        canvas.width = state.tokens.length * cellWidth; canvas.height = 12;
        drawStrip(canvas, weights, cellWidth);
        canvas.addEventListener("click", function () { openHead(layer, h); });
        line.appendChild(name); line.appendChild(canvas);
        panel.appendChild(line);
      });
      var chosen = state.head === null ? [] : data.weights[state.head];
      var found = paintTokenWeights(tokenEls, chosen, query);
      idle(msg("status", {
        query: query, query_token: shownToken(state.tokens[query]), head: layer + "." + (state.head === null ? "-" : state.head),
        best: found.best, best_token: shownToken(state.tokens[found.best]), weight: num(found.weight) }));
    }).catch(fail);
  }
  for (var l = 0; l < L; l++) {
    var option = document.createElement("option");
    option.value = String(l); option.textContent = msg("grid_layer", { layer: l });
    $("row-layer").appendChild(option);
  }
  $("row-layer").addEventListener("change", function () {
    state.layer = parseInt($("row-layer").value, 10);
    if (state.head !== null) { openHead(state.layer, state.head); } else if (state.query !== null) { refreshRow(); }
  });

  // -- roles: filter the grid, or pick a role's heads for removal ----------------------------------------
  MODEL.roles.forEach(function (role) {
    ["role-filter", "ablate-role"].forEach(function (id) {
      var option = document.createElement("option");
      option.value = role; option.textContent = role;
      $(id).appendChild(option);
    });
    var key = document.createElement("span");
    key.className = "key"; key.textContent = role; key.style.borderColor = colour(role);
    $("legend").appendChild(key);
  });
  $("role-filter").addEventListener("change", applyFilter);
  $("ablate-clear").addEventListener("click", function () {
    state.ticked = {};
    Object.keys(cells).forEach(function (name) { cells[name].tick.checked = false; });
    showTicked();
  });

  function position() { return state.query !== null ? state.query : state.tokens.length - 1; }

  // -- removal: per-token loss before / after on the text, top-5 at the chosen position ------------------
  $("ablate-go").addEventListener("click", function () {
    var role = $("ablate-role").value;
    var method = document.querySelector("input[name=method]:checked").value;
    var at = position();
    api("/api/ablate", { run: state.run, heads: role || Object.keys(state.ticked), method: method, position: at })
      .then(function (data) { showAblation(data, at); idle(); }).catch(fail);
  });
  function showAblation(data, at) {
    var summary = $("ablate-summary");
    summary.textContent = msg("x_loss_summary", { before: num(data.loss), after: num(data.loss_ablated),
      n: data.clean.length, heads: data.heads.join(", "), method: data.method });
    summary.setAttribute("data-loss", String(data.loss));
    summary.setAttribute("data-loss-ablated", String(data.loss_ablated));
    var box = $("ablate-tokens"), top = 0;
    box.textContent = "";
    data.clean.forEach(function (before, i) { top = Math.max(top, Math.abs(data.ablated[i] - before)); });
    data.clean.forEach(function (before, i) {
      var after = data.ablated[i], pos = i + 1, delta = after - before;
      var span = tokenSpan(state.tokens[pos], pos, chooseToken);
      var a = top > 0 ? Math.abs(delta) / top : 0;
      span.style.backgroundColor = (delta >= 0 ? "rgba(220, 40, 40, " : "rgba(40, 90, 220, ") + a.toFixed(3) + ")";
      span.title = msg("x_loss_token", { pos: pos, token: shownToken(state.tokens[pos]), before: num(before),
        after: num(after) });
      span.setAttribute("data-before", String(before));
      span.setAttribute("data-after", String(after));
      box.appendChild(span);
    });
    topTable($("top-before"), msg("x_top_before", { pos: at }), data.top_clean);
    topTable($("top-after"), msg("x_top_after", { pos: at }), data.top_ablated);
  }
  function topTable(table, caption, rows) {
    table.textContent = "";
    table.createCaption().textContent = caption;
    var body = table.createTBody();
    rows.forEach(function (row) {
      var tr = body.insertRow();
      var token = tr.insertCell();
      token.className = "tok-cell"; token.textContent = shownToken(row.token);
      tr.insertCell().textContent = num(row.prob);
    });
  }

  // -- who wrote this prediction: every head's direct effect as a layers x heads map ---------------------
  $("direct-go").addEventListener("click", function () {
    var at = position();
    api("/api/direct", { run: state.run, position: at, target: $("direct-target").value || null,
      foil: $("direct-foil").value || null }).then(function (data) { showDirect(data); idle(); }).catch(fail);
  });
  function showDirect(data) {
    var sum = 0, top = 0;
    data.direct.forEach(function (row) { row.forEach(function (v) { sum += v; top = Math.max(top, Math.abs(v)); }); });
    $("direct-summary").textContent = msg("x_direct_summary", { pos: data.position, target: shownToken(data.target),
      foil: data.foil === null ? "" : msg("x_direct_foil", { foil: shownToken(data.foil) }),
      logit: num(data.logit), sum: num(sum) });
    var map = $("direct-map");
    map.textContent = "";
    var table = document.createElement("table");
    table.className = "direct-map";
    var head = table.insertRow();
    head.appendChild(document.createElement("th"));
    for (var h = 0; h < H; h++) {
      var th = document.createElement("th"); th.textContent = String(h); head.appendChild(th);
    }
    data.direct.forEach(function (row, l) {
      var tr = table.insertRow();
      var th = document.createElement("th"); th.textContent = msg("grid_layer", { layer: l }); tr.appendChild(th);
      row.forEach(function (v, hh) {
        var td = tr.insertCell(), a = top > 0 ? Math.abs(v) / top : 0;
        td.style.backgroundColor = (v >= 0 ? "rgba(220, 40, 40, " : "rgba(40, 90, 220, ") + a.toFixed(3) + ")";
        td.title = msg("x_direct_cell", { head: l + "." + hh, value: num(v) });
        td.setAttribute("data-head", l + "." + hh);
        td.setAttribute("data-value", String(v));
      });
    });
    map.appendChild(table);
  }
})();
