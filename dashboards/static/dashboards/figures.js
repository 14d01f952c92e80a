// Pages that embed their chart figures as JSON (the rollout page, a chaos run's report): each element with
// data-figures="<id of a json_script>" gets one plotly chart per figure ({key, data, layout}); the page itself
// reloads while what it shows is in progress.
(function () {
  "use strict";
  function draw(container) {
    var source = document.getElementById(container.dataset.figures);
    if (!source) { return; }
    JSON.parse(source.textContent).forEach(function (figure) {
      var div = document.createElement("div");
      div.className = "chart";
      div.dataset.chart = figure.key;
      div.dataset.points = String(figure.data.reduce(function (n, t) { return n + t.x.length; }, 0));
      container.appendChild(div);
      window.Plotly.newPlot(div, figure.data, figure.layout, {displayModeBar: false, responsive: true});
    });
  }
  function start() {
    if (!window.Plotly) { return; }
    Array.prototype.forEach.call(document.querySelectorAll("[data-figures]"), draw);
  }
  if (document.readyState === "complete") { start(); } else { window.addEventListener("load", start); }
})();
