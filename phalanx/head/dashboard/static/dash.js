// Phalanx dashboard: the job page's charts (uPlot) and the log view's bound. Everything
// else is htmx attributes in the HTML; no inline script (the Content-Security-Policy
// allows scripts from this head only).
(function () {
  "use strict";
  var MAX_POINTS = 720;       // points a chart keeps while the page is open
  var MAX_LOG_CHARS = 400000; // the log view keeps the newest this many characters
  var charts = {};

  function seriesData(id) {
    var el = document.getElementById(id || "series-data");
    if (!el) { return null; }
    try { return JSON.parse(el.getAttribute("data-series")); } catch (e) { return null; }
  }

  function width(el) { return Math.max(300, el.clientWidth || 600); }

  // One chart: x = time, one series per name; points are appended as fragments arrive.
  function chart(id, names, scales) {
    var el = document.getElementById(id);
    if (!el || typeof uPlot === "undefined") { return null; }
    var c = charts[id];
    var key = names.join("|");
    if (c && c.key === key) { return c; }
    if (c) { c.plot.destroy(); }
    var palette = ["#2f6fde", "#2e9d5b", "#d68910", "#c0392b", "#8e44ad", "#16a085", "#7f8c8d", "#e67e22"];
    var series = [{}];
    names.forEach(function (n, i) {
      series.push({ label: n, stroke: palette[i % palette.length], width: 1.5, scale: scales[n] || "y", spanGaps: true });
    });
    var axes = [{}, { scale: "y" }];
    el.textContent = "";
    if (Object.values(scales).indexOf("mfu") >= 0) { axes.push({ scale: "mfu", side: 1, grid: { show: false } }); }
    var data = [[]].concat(names.map(function () { return []; }));
    var pad = function (u, min, max) { return min === max ? [min - 60, max + 60] : [min, max]; };
    var ys = { x: { time: true, range: pad } };
    ys.y = (id === "gpu-chart" || id === "util-chart") ? { range: [0, 100] } : {};
    if (Object.values(scales).indexOf("mfu") >= 0) { ys.mfu = { range: [0, 1] }; }
    var opts = { width: width(el), height: 200, series: series, axes: axes, scales: ys };
    c = { key: key, names: names, data: data, plot: new uPlot(opts, data, el), last: null };
    charts[id] = c;
    return c;
  }

  function append(c, t, values) {
    if (!c || t === null || t === undefined || (c.last !== null && t <= c.last)) { return; }
    c.last = t;
    c.data[0].push(t);
    c.names.forEach(function (n, i) { c.data[i + 1].push(values[n] === undefined ? null : values[n]); });
    if (c.data[0].length > MAX_POINTS) { c.data.forEach(function (col) { col.shift(); }); }
    c.plot.setData(c.data);
  }

  function updateCharts(id) {
    var s = seriesData(typeof id === "string" ? id : undefined);
    if (!s) { return; }
    var gpu = s.gpu || {};
    var names = Object.keys(gpu.series || {}).sort();
    if (names.length && gpu.t && gpu.t.length) {
      var c = chart("gpu-chart", names, {});
      for (var i = 0; i < gpu.t.length; i++) {
        var v = {};
        names.forEach(function (n) { v[n] = gpu.series[n][i]; });
        append(c, gpu.t[i], v);
      }
    }
    var u = s.cluster || {};
    if (u.t && u.t.length) {
      var uc = chart("util-chart", ["all", "allocated"], {});
      for (var k = 0; k < u.t.length; k++) { append(uc, u.t[k], { all: u.all[k], allocated: u.allocated[k] }); }
    }
    var p = s.progress || {};
    if (p.t && p.t.length) {
      var pc = chart("progress-chart", ["loss", "mfu"], { loss: "y", mfu: "mfu" });
      for (var j = 0; j < p.t.length; j++) { append(pc, p.t[j], { loss: p.loss[j], mfu: p.mfu[j] }); }
    }
  }

  function trimLog() {
    var log = document.getElementById("log");
    if (!log) { return; }
    while (log.textContent.length > MAX_LOG_CHARS && log.firstChild) { log.removeChild(log.firstChild); }
    var near = log.scrollHeight - log.scrollTop - log.clientHeight < 80;
    if (near || !log.dataset.scrolled) { log.scrollTop = log.scrollHeight; }
  }

  // The page's history from the telemetry store first, then the live fragment's latest.
  document.addEventListener("DOMContentLoaded", function () {
    updateCharts("series-history");
    updateCharts();
  });
  document.addEventListener("htmx:afterSwap", function (e) {
    if (e.target && e.target.id === "log") { trimLog(); } else { updateCharts(); }
  });
  // A live update never replaces the field someone is typing in (a drain reason, a
  // filter): that fragment waits for the next update, after the field loses focus.
  document.addEventListener("htmx:sseBeforeMessage", function (e) {
    var active = document.activeElement;
    if (active && e.target && e.target.contains(active) &&
        active.matches("input, textarea, select")) {
      e.preventDefault();
    }
  });
  document.addEventListener("htmx:sseMessage", function (e) {
    if (e.detail && e.detail.type === "log") { trimLog(); }
  });
  document.addEventListener("htmx:sseClose", function () {
    var eof = document.getElementById("log-eof");
    if (eof && !eof.textContent) { eof.textContent = "(this rank has ended)"; }
  });
})();
