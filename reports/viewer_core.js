// headlens attention views, shared by the report's viewer (report.js) and the live explorer
// (explore/explore.js): the message catalogue, tokens as shown, tokens coloured by attention weights,
// and one head's attention strip. Plain JavaScript, no network. User text only ever reaches the page
// through textContent, never innerHTML.
"use strict";

// The page's messages in its language, from the JSON block #report-messages (the message catalogue).
var MESSAGES = (function () {
  var el = document.getElementById("report-messages");
  return el ? JSON.parse(el.textContent) : {};
})();

// Message `key` with {name} placeholders filled from `values`.
function msg(key, values) {
  var text = MESSAGES[key] !== undefined ? MESSAGES[key] : key;
  return text.replace(/\{(\w+)\}/g, function (all, name) {
    return values && values[name] !== undefined ? String(values[name]) : all;
  });
}

// A number as the page writes every measured quantity (headlens.reports.i18n.significant): 3 significant
// figures, written out from 0.001 up, in the page's language (msg("decimal_mark"): "." or ",").
function num(x) {
  var v = Number(x);
  if (!isFinite(v)) { return String(v); }
  if (v === 0) { return "0"; }
  var text = Math.abs(v) >= 0.001 ? v.toPrecision(3) : v.toExponential(2).replace(/e([-+]\d+)$/, function (all, e) {
    return " \u00d7 10" + String(Number(e)).replace(/./g, function (c) { return "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079".charAt("-0123456789".indexOf(c)); });
  });
  if (/e/.test(text)) { text = String(Math.round(v)); }
  return text.replace(".", MESSAGES.decimal_mark || ".");
}

// A share as a percentage as the page writes it (headlens.reports.i18n.percent): 3 significant figures without
// trailing zeros, the sign as the language places it (msg("percent")).
function pct(share) {
  var mark = MESSAGES.decimal_mark || ".";
  var text = num(100 * Number(share));
  if (text.indexOf(mark) >= 0) { text = text.replace(/0+$/, ""); }
  if (text.slice(-1) === mark) { text = text.slice(0, -1); }
  return msg("percent", { value: text });
}

// A token as shown: newlines and tabs made visible.
function shownToken(token) { return String(token).replace(/\n/g, "\u21b5").replace(/\t/g, "\u2192"); }

// A clickable token (Enter works too), its text set as text, never parsed as HTML.
function tokenSpan(token, pos, onChoose) {
  var span = document.createElement("span");
  span.className = "tok";
  span.textContent = shownToken(token);
  span.setAttribute("data-pos", String(pos));
  span.tabIndex = 0;
  span.addEventListener("click", function () { onChoose(pos); });
  span.addEventListener("keydown", function (e) { if (e.key === "Enter") { onChoose(pos); } });
  return span;
}

// Colour token spans by one head's weights from the query token (weights[k], 0 beyond its length); the
// query outlined. Each span keeps its weight in data-weight. Returns {best, weight}: the strongest key.
function paintTokenWeights(spans, weights, query) {
  var best = 0, bestW = -1;
  spans.forEach(function (span, k) {
    var w = k < weights.length ? weights[k] : 0;
    if (w > bestW) { bestW = w; best = k; }
    span.style.backgroundColor = "rgba(40, 110, 255, " + w.toFixed(3) + ")";
    span.style.color = w > 0.55 ? "#fff" : "";
    span.title = msg("weight", { weight: num(w) });
    span.setAttribute("data-weight", w.toFixed(4));
    span.classList.toggle("query", k === query);
  });
  return { best: best, weight: bestW };
}

// One head's attention strip from a query: cell k brightness = weights[k] / max (each strip scaled to its
// own maximum), `cellWidth` pixels per key token.
function drawStrip(canvas, weights, cellWidth) {
  var ctx = canvas.getContext("2d");
  ctx.fillStyle = "#000"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  var top = 0;
  for (var j = 0; j < weights.length; j++) { top = Math.max(top, weights[j]); }
  for (var k = 0; k < weights.length; k++) {
    var w = top > 0 ? weights[k] / top : 0;
    ctx.fillStyle = "rgba(255, 200, 40, " + w.toFixed(3) + ")";
    ctx.fillRect(k * cellWidth, 0, cellWidth, canvas.height);
  }
}
