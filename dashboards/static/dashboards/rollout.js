// Rollout page: the overlaid per-revision charts (stable solid, the tried revision dashed) from the figures the
// page embeds as JSON; the page itself reloads every 5 s while the rollout is active.
(function () {
  "use strict";
  function start() {
    var container = document.getElementById("rollout-charts");
    var source = document.getElementById("rollout-figures");
    if (!container || !source || !window.Plotly) { return; }
    JSON.parse(source.textContent).forEach(function (figure) {
      var div = document.createElement("div");
      div.className = "chart";
      div.dataset.chart = figure.key;
      div.dataset.points = String(figure.data.reduce(function (n, t) { return n + t.x.length; }, 0));
      container.appendChild(div);
      window.Plotly.newPlot(div, figure.data, figure.layout, {displayModeBar: false, responsive: true});
    });
  }
  if (document.readyState === "complete") { start(); } else { window.addEventListener("load", start); }
})();
