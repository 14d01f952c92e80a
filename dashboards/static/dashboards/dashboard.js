// Live deployment page: the pools/workers/actions fragment replaced every 5 s without reloading the page, and the
// charts drawn with Plotly.react when they are on screen. Plain fetch; no framework.
//
// A page of ~25 plotly charts drawn at once keeps a loaded 2-core machine's main thread busy for many seconds
// before the page answers a click. So a chart is drawn when it scrolls into view (IntersectionObserver), and each
// refresh fetches every figure (the JSON costs the browser little) but redraws only the charts in view; a chart
// that comes into view later is drawn at once from the newest figure the page holds (at most a refresh old). Each
// chart's div says what it holds: data-points (points in its newest figure, drawn or not) and data-draws (how
// often it was drawn; 0: not yet). performance.mark("tandem:first-chart") and ("tandem:charts-ready") time the
// first draw and the end of the first refresh.
(function () {
  "use strict";
  var REFRESH_MS = 5000;
  // Drawn a little before they scroll in, so that a chart is there when it appears.
  var AHEAD_PX = 150;
  var chartsEl = document.getElementById("charts");
  var stagesEl = document.getElementById("stage-columns");
  var liveEl = document.getElementById("live");
  var stateEl = document.getElementById("refresh-state");
  if (!chartsEl) { return; }
  var range = chartsEl.dataset.range;
  var busy = false;
  // Per source (charts.json, stages.json): its newest figures, and the range they are of.
  var sources = {charts: {figures: {}, range: null}, stages: {figures: {}, range: null}};
  var visible = {};  // chart key → on screen now
  var drawnFigure = {};  // chart key → the figure object it was last drawn from
  var firstDrawn = false;
  var observer = "IntersectionObserver" in window
    ? new IntersectionObserver(onIntersect, {rootMargin: AHEAD_PX + "px 0px"}) : null;

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

  function chartDiv(key, container, source) {
    var div = document.getElementById("chart-" + key);
    if (!div) {
      div = document.createElement("div");
      div.id = "chart-" + key;
      div.className = "chart";
      div.dataset.chart = key;
      div.dataset.source = source;
      div.dataset.draws = "0";
      container.appendChild(div);
      if (observer) { observer.observe(div); } else { visible[key] = true; }
    }
    return div;
  }

  function render(div) {
    // Draws the newest figure of a chart in view, unless it is what the chart already shows.
    var key = div.dataset.chart;
    var source = sources[div.dataset.source];
    var figure = source.figures[key];
    if (!figure || !visible[key] || drawnFigure[key] === figure || source.range !== range) { return null; }
    drawnFigure[key] = figure;
    return window.Plotly.react(div, figure.data, figure.layout, {displayModeBar: false, responsive: true})
      .then(function () {
        div.dataset.draws = String(Number(div.dataset.draws) + 1);
        if (!firstDrawn) { firstDrawn = true; performance.mark("tandem:first-chart"); }
      });
  }

  function onIntersect(entries) {
    entries.forEach(function (entry) {
      visible[entry.target.dataset.chart] = entry.isIntersecting;
      if (entry.isIntersecting && window.Plotly) { render(entry.target); }
    });
  }

  function onScreen(div) {
    var box = div.getBoundingClientRect();
    return box.bottom > -AHEAD_PX && box.top < window.innerHeight + AHEAD_PX;
  }

  function place(keys, figures, container, wanted, source) {
    // Every chart gets its div (so that the page keeps its layout) and its newest figure; returns the divs.
    if (!container) { return []; }
    return keys.map(function (key) {
      wanted[key] = true;
      var figure = figures[key];
      var div = chartDiv(key, container, source);
      div.dataset.points = String(figure.data.reduce(function (n, trace) {
        return n + (trace.x ? trace.x.length : 0); }, 0));
      return div;
    });
  }

  function drawInView(divs) {
    // A new div's visibility is measured here, in one layout pass, rather than at the observer's first report:
    // the charts on screen are drawn by this refresh.
    divs.forEach(function (div) {
      if (visible[div.dataset.chart] === undefined) { visible[div.dataset.chart] = onScreen(div); }
    });
    return Promise.all(divs.map(render));
  }

  function keep(name, figures, requested) {
    // An answer for a range the page has left (a click on another range while it was on its way) is dropped.
    if (requested !== range) { return false; }
    sources[name].figures = figures;
    sources[name].range = requested;
    return true;
  }

  function drawStages(stages, requested) {
    if (!keep("stages", stages.figures, requested)) { return null; }
    var wanted = {};
    var divs = [];
    // Each stage column gets its charts; its current values are rewritten in place.
    stages.columns.forEach(function (column) {
      divs = divs.concat(place(column.order, stages.figures, document.getElementById("stage-charts-" + column.role),
                               wanted, "stages"));
      column.values.forEach(function (item) {
        var cell = document.querySelector('[data-stage-value="' + column.role + ":" + item.key + '"]');
        if (cell) { cell.textContent = item.text; }
      });
    });
    divs = divs.concat(place(stages.health_order, stages.figures, document.getElementById("health-charts"),
                             wanted, "stages"));
    drop(stagesEl.parentNode, wanted);
    return drawInView(divs);
  }

  function drop(container, wanted) {
    // A panel that is no longer part of the page (GPU ↔ CPU) goes away.
    Array.prototype.forEach.call(container.querySelectorAll(".chart[data-chart]"), function (div) {
      if (wanted[div.dataset.chart]) { return; }
      if (observer) { observer.unobserve(div); }
      delete visible[div.dataset.chart];
      delete drawnFigure[div.dataset.chart];
      window.Plotly.purge(div);
      div.remove();
    });
  }

  function drawCharts(payload, requested) {
    if (!keep("charts", payload.figures, requested)) { return null; }
    var loading = document.getElementById("charts-loading");
    if (loading) { loading.remove(); }
    var wanted = {};
    var divs = place(payload.order, payload.figures, chartsEl, wanted, "charts");
    drop(chartsEl, wanted);
    return drawInView(divs);
  }

  function refreshCharts() {
    var requested = range;
    return get(chartsEl.dataset.url + "?range=" + encodeURIComponent(requested), "application/json")
      .then(function (payload) { return drawCharts(payload, requested); });
  }

  function refreshStages() {
    if (!stagesEl) { return Promise.resolve(); }
    var requested = range;
    return get(stagesEl.dataset.url + "?range=" + encodeURIComponent(requested), "application/json")
      .then(function (payload) { return drawStages(payload, requested); });
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

  var ticks = 0;
  function tick() {
    if (busy || document.hidden || !window.Plotly) { return; }
    busy = true;
    Promise.all([refreshCharts(), refreshStages(), refreshLive()]).then(function () {
      if (ticks++ === 0) { performance.mark("tandem:charts-ready"); }
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
