// Live deployment page: charts redrawn with Plotly.react and the pools/workers/actions fragment replaced every
// 5 s, without reloading the page. Plain fetch; no framework.
(function () {
  "use strict";
  var REFRESH_MS = 5000;
  var chartsEl = document.getElementById("charts");
  var stagesEl = document.getElementById("stage-columns");
  var liveEl = document.getElementById("live");
  var stateEl = document.getElementById("refresh-state");
  if (!chartsEl) { return; }
  var range = chartsEl.dataset.range;
  var busy = false;

  function setState(text, bad) {
    if (!stateEl) { return; }
    stateEl.textContent = text;
    stateEl.classList.toggle("bad-text", !!bad);
  }

  function get(url, accept) {
    return fetch(url, {credentials: "same-origin", headers: {"Accept": accept, "X-Requested-With": "fetch"}})
      .then(function (response) {
        if (response.redirected && response.url.indexOf("/accounts/login/") !== -1) {
          throw new Error("signed out: reload the page to log in again");
        }
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return accept === "application/json" ? response.json() : response.text();
      });
  }

  function chartDiv(key, container) {
    var div = document.getElementById("chart-" + key);
    if (!div) {
      div = document.createElement("div");
      div.id = "chart-" + key;
      div.className = "chart";
      div.dataset.chart = key;
      container.appendChild(div);
    }
    return div;
  }

  function draw(keys, figures, container, wanted) {
    if (!container) { return; }
    keys.forEach(function (key) {
      wanted[key] = true;
      var figure = figures[key];
      var div = chartDiv(key, container);
      var points = figure.data.reduce(function (n, trace) { return n + (trace.x ? trace.x.length : 0); }, 0);
      div.dataset.points = String(points);
      window.Plotly.react(div, figure.data, figure.layout, {displayModeBar: false, responsive: true});
    });
  }

  function drawStages(stages) {
    var wanted = {};
    // Each stage column gets its charts; its current values are rewritten in place.
    stages.columns.forEach(function (column) {
      draw(column.order, stages.figures, document.getElementById("stage-charts-" + column.role), wanted);
      column.values.forEach(function (item) {
        var cell = document.querySelector('[data-stage-value="' + column.role + ":" + item.key + '"]');
        if (cell) { cell.textContent = item.text; }
      });
    });
    draw(stages.health_order, stages.figures, document.getElementById("health-charts"), wanted);
    drop(stagesEl.parentNode, wanted);
  }

  function drop(container, wanted) {
    // A panel that is no longer part of the page (GPU ↔ CPU) goes away.
    Array.prototype.forEach.call(container.querySelectorAll(".chart[data-chart]"), function (div) {
      if (!wanted[div.dataset.chart]) { window.Plotly.purge(div); div.remove(); }
    });
  }

  function drawCharts(payload) {
    var loading = document.getElementById("charts-loading");
    if (loading) { loading.remove(); }
    var wanted = {};
    draw(payload.order, payload.figures, chartsEl, wanted);
    drop(chartsEl, wanted);
  }

  function refreshCharts() {
    return get(chartsEl.dataset.url + "?range=" + encodeURIComponent(range), "application/json").then(drawCharts);
  }

  function refreshStages() {
    if (!stagesEl) { return Promise.resolve(); }
    return get(stagesEl.dataset.url + "?range=" + encodeURIComponent(range), "application/json").then(drawStages);
  }

  function editing() {
    // Never replace the fragment under an operator who is typing a replica count.
    var active = document.activeElement;
    return liveEl && active && liveEl.contains(active) && (active.tagName === "INPUT" || active.tagName === "SELECT");
  }

  function refreshLive() {
    if (!liveEl || editing()) { return Promise.resolve(); }
    return get(liveEl.dataset.url, "text/html").then(function (html) {
      if (!editing()) { liveEl.innerHTML = html; }
    });
  }

  function tick() {
    if (busy || document.hidden || !window.Plotly) { return; }
    busy = true;
    Promise.all([refreshCharts(), refreshStages(), refreshLive()]).then(function () {
      setState("live: updated " + new Date().toLocaleTimeString(), false);
    }).catch(function (error) {
      setState("refresh failed (" + error.message + "): retrying every 5 s", true);
    }).then(function () { busy = false; });
  }

  Array.prototype.forEach.call(document.querySelectorAll(".segmented a[data-range]"), function (link) {
    link.addEventListener("click", function (event) {
      event.preventDefault();
      range = link.dataset.range;
      Array.prototype.forEach.call(document.querySelectorAll(".segmented a"), function (a) {
        a.classList.toggle("active", a === link);
      });
      var params = new URLSearchParams(location.search);
      params.set("range", range);
      history.replaceState(null, "", "?" + params.toString());
      busy = false;
      tick();
    });
  });

  // Links that reload the page with another option (showing stopped workers) keep the chosen time range.
  document.addEventListener("click", function (event) {
    var link = event.target.closest ? event.target.closest("a[data-keep-range]") : null;
    if (!link) { return; }
    var url = new URL(link.href);
    url.searchParams.set("range", range);
    link.href = url.toString();
  });

  // The buttons' forms post the chosen time range, so the page comes back to it after the action.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!liveEl || !liveEl.contains(form) || form.querySelector("input[name=range]")) { return; }
    var input = document.createElement("input");
    input.type = "hidden";
    input.name = "range";
    input.value = range;
    form.appendChild(input);
  });

  function start() {
    if (!window.Plotly) { setState("plotly.js did not load: charts unavailable", true); return; }
    tick();
    window.setInterval(tick, REFRESH_MS);
  }
  if (document.readyState === "complete") { start(); } else { window.addEventListener("load", start); }
})();
