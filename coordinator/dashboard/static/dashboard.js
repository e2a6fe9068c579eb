/* fedprompt dashboard: polls the server-rendered live regions, swaps them in, draws the charts,
   and sends operator actions to the same REST endpoints curl uses (session cookie + CSRF header). */
(function () {
  "use strict";

  var body = document.body;
  var POLL_MS = parseInt(body.dataset.pollMs || "1000", 10);
  var CSRF = body.dataset.csrf || "fedprompt-dashboard";
  var fid = body.dataset.federation ? parseInt(body.dataset.federation, 10) : null;
  var clockOffset = 0; // server time minus browser time, in seconds
  var charts = {};
  var chartFederation = null;
  var timer = null;
  var stopped = false;

  function $(id) { return document.getElementById(id); }

  function readClock() {
    var el = $("server-clock");
    if (el) clockOffset = parseFloat(el.dataset.now) - Date.now() / 1000;
  }

  function nowS() { return Date.now() / 1000 + clockOffset; }

  function fmtDuration(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " m " + String(s % 60).padStart(2, "0") + " s";
    return Math.floor(s / 3600) + " h " + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + " m";
  }

  function fmtBytes(v) {
    if (v == null) return "—";
    var units = ["B", "KiB", "MiB", "GiB"], i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
  }

  function tick() {
    var now = nowS();
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var left = parseFloat(el.dataset.deadline) - now;
      el.textContent = left >= 0 ? fmtDuration(left) + " left" : "overdue by " + fmtDuration(-left);
      el.classList.toggle("overdue", left < 0);
    });
    document.querySelectorAll("[data-since]").forEach(function (el) {
      el.textContent = fmtDuration(now - parseFloat(el.dataset.since));
    });
    document.querySelectorAll("time[data-ago]").forEach(function (el) {
      el.textContent = fmtDuration(now - parseFloat(el.dataset.ago)) + " ago";
    });
  }

  function flash(text, ok) {
    var box = $("flash");
    var msg = document.createElement("div");
    msg.className = "msg " + (ok ? "ok" : "bad");
    msg.textContent = text;
    box.appendChild(msg);
    setTimeout(function () { msg.remove(); }, ok ? 6000 : 15000);
  }

  function setLive(ok, text) {
    var el = $("live-indicator");
    if (!el) return;
    el.classList.toggle("stale", !ok);
    el.textContent = ok ? "● live · " + new Date().toLocaleTimeString() : "● " + text;
  }

  function swapRegions(html) {
    var doc = new DOMParser().parseFromString("<!doctype html><body>" + html + "</body>", "text/html");
    doc.querySelectorAll("[data-live][id]").forEach(function (fresh) {
      var current = $(fresh.id);
      if (current && current.outerHTML !== fresh.outerHTML) {
        current.replaceWith(document.importNode(fresh, true));
      }
    });
  }

  function schedule() {
    if (stopped) return;
    clearTimeout(timer);
    timer = setTimeout(poll, POLL_MS);
  }

  function poll() {
    var url = "/dashboard/live" + (fid != null ? "?federation=" + fid : "");
    return fetch(url, { credentials: "same-origin", cache: "no-store", headers: { "X-Requested-With": CSRF } })
      .then(function (resp) {
        if (resp.status === 401 || resp.status === 403) {
          stopped = true;
          setLive(false, "session expired");
          flash("Your session expired: log in again at /dashboard/login.", false);
          return;
        }
        if (!resp.ok) throw new Error("HTTP " + resp.status);
        return resp.text().then(function (html) {
          swapRegions(html);
          readClock();
          drawCharts();
          tick();
          setLive(true);
        });
      })
      .catch(function (err) { setLive(false, "offline (" + err.message + "), retrying"); })
      .then(schedule);
  }

  // -- charts (uPlot, served from this package) ------------------------------------------------

  function chartData() {
    var el = $("chart-data");
    if (!el) return null;
    try { return JSON.parse(el.textContent); } catch (e) { return null; }
  }

  var palette = { blue: "#2563eb", green: "#15803d", red: "#b91c1c", amber: "#b45309", grey: "#6b7280" };

  function specs(has_asr) {
    var pct = function (u, vals) { return vals.map(function (v) { return v == null ? "" : (100 * v).toFixed(0) + "%"; }); };
    // whole bytes only: an axis over 0..1 B would otherwise read "0 B, 0 B, 1 B, 1 B"
    var bytes = function (u, vals) { return vals.map(function (v) { return v == null || !Number.isInteger(v) ? "" : fmtBytes(v); }); };
    var bars = uPlot.paths && uPlot.paths.bars;
    var fromZero = function (u, min, max) { return [0, max > 0 ? max * 1.1 : 1]; };
    var bytesFromZero = function (u, min, max) { return [0, max > 0 ? max * 1.1 : 1024]; };
    return {
      accuracy: { keys: ["accuracy"], series: [{ label: "accuracy", stroke: palette.blue, width: 2 }], yfmt: pct, range: [0, 1] },
      loss: { keys: ["loss", "train_loss"], range: fromZero, series: [
        { label: "eval loss", stroke: palette.amber, width: 2 },
        { label: "train loss", stroke: palette.grey, width: 2, dash: [5, 4] }] },
      asr: has_asr ? { keys: ["asr"], series: [{ label: "ASR", stroke: palette.red, width: 2 }], yfmt: pct, range: [0, 1] }
        : { empty: "— no client reported an attack success rate ('asr' in its evaluation metrics)" },
      bytes: { keys: ["bytes_up", "bytes_down"], yfmt: bytes, ysize: 72, range: bytesFromZero, series: [
        { label: "up", stroke: palette.blue, fill: "rgba(37,99,235,.35)", paths: bars && bars({ size: [0.35, 40], align: -1 }), points: { show: false } },
        { label: "down", stroke: palette.green, fill: "rgba(21,128,61,.35)", paths: bars && bars({ size: [0.35, 40], align: 1 }), points: { show: false } }] },
    };
  }

  // the axes' ranges as data attributes (the axes themselves are drawn on a canvas)
  function showScales(el, plot) {
    el.dataset.x = plot.scales.x.min + "," + plot.scales.x.max;
    el.dataset.y = plot.scales.y.min + "," + plot.scales.y.max;
  }

  function drawCharts() {
    var data = chartData();
    var section = $("charts");
    if (!data || data.federation == null || !data.series) { if (section) section.hidden = true; return; }
    section.hidden = false;
    if (typeof uPlot === "undefined") return;
    if (chartFederation !== data.federation) {
      Object.keys(charts).forEach(function (k) { if (charts[k].plot) charts[k].plot.destroy(); });
      charts = {};
      chartFederation = data.federation;
    }
    var defs = specs(data.has_asr);
    Object.keys(defs).forEach(function (name) {
      var def = defs[name];
      var el = $("chart-" + name);
      var s = data.series;
      var mode = def.empty ? "empty" : s.version.length ? "plot" : "nodata";
      var figure = el.closest("figure");
      if (figure) figure.hidden = mode === "empty";  // no ASR reported (no backdoor): no ASR chart
      var prev = charts[name];
      if (prev && prev.mode !== mode) { if (prev.plot) prev.plot.destroy(); prev = null; }
      if (mode !== "plot") {
        if (!prev) {
          el.innerHTML = "";
          var div = document.createElement("div");
          div.className = "empty";
          div.textContent = mode === "empty" ? def.empty : "— no closed round yet";
          el.appendChild(div);
          charts[name] = { mode: mode };
        }
        return;
      }
      var rows = [s.version].concat(def.keys.map(function (k) { return s[k]; }));
      // the versions shown, half a version either side: uPlot would stretch one point to 0..100
      var xr = [Math.min.apply(null, s.version) - 0.5, Math.max.apply(null, s.version) + 0.5];
      if (prev) { prev.plot.setData(rows, false); prev.plot.setScale("x", { min: xr[0], max: xr[1] }); return; }
      el.innerHTML = "";
      var opts = {
        width: Math.max(el.clientWidth, 260),
        height: 200,
        scales: { x: { time: false, auto: false, range: function () { return xr; } },
                  y: def.range ? { range: def.range } : {} },
        legend: { live: false },
        series: [{ label: "prompt version" }].concat(def.series.map(function (x) {
          return Object.assign({ spanGaps: true, points: { show: true, size: 6 } }, x);
        })),
        axes: [{ incrs: [1, 2, 5, 10, 20, 50, 100], values: function (u, vals) { return vals.map(function (v) { return Number.isInteger(v) ? String(v) : ""; }); } },
               def.yfmt ? { values: def.yfmt, size: def.ysize || 60 } : { size: 50 }],
      };
      opts.hooks = { setScale: [function (u) { showScales(el, u); }] };
      charts[name] = { mode: mode, plot: new uPlot(opts, rows, el) };
      charts[name].plot.setScale("x", { min: xr[0], max: xr[1] });
    });
  }

  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (k) {
      var c = charts[k];
      if (c.plot) c.plot.setSize({ width: Math.max($("chart-" + k).clientWidth, 260), height: 200 });
    });
  });

  // -- operator actions -------------------------------------------------------------------------

  function confirmThen(text, run) {
    var dialog = $("confirm");
    $("confirm-text").textContent = text;
    dialog.returnValue = "";
    dialog.addEventListener("close", function onClose() {
      dialog.removeEventListener("close", onClose);
      if (dialog.returnValue === "ok") run();
    });
    dialog.showModal();
  }

  function act(method, url, label) {
    return fetch(url, { method: method, credentials: "same-origin", headers: { "X-Requested-With": CSRF } })
      .then(function (resp) {
        if (resp.ok) { flash(label + ": done", true); return; }
        return resp.json().catch(function () { return {}; }).then(function (problem) {
          flash(label + " failed: " + (problem.detail || problem.title || "HTTP " + resp.status), false);
        });
      })
      .catch(function (err) { flash(label + " failed: " + err.message, false); })
      .then(function () { clearTimeout(timer); return poll(); });
  }

  document.addEventListener("click", function (ev) {
    var pick = ev.target.closest("[data-select-federation]");
    if (pick) {
      ev.preventDefault();
      fid = parseInt(pick.dataset.selectFederation, 10);
      history.replaceState(null, "", "/dashboard?federation=" + fid);
      clearTimeout(timer);
      poll();
      return;
    }
    var button = ev.target.closest("button[data-action]");
    if (button) {
      ev.preventDefault();
      var method = button.dataset.method, url = button.dataset.url, label = button.textContent.trim();
      confirmThen(button.dataset.confirm, function () { act(method, url, label); });
    }
  });

  readClock();
  drawCharts();
  tick();
  setInterval(tick, 250);
  schedule();
})();
