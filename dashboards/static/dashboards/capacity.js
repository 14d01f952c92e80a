// Capacity page: profile plots, a profile run with its progress (polled; when it finishes the profile section is
// fetched again and replaced in place), and the planner: every change of an input or a what-if slider recomputes
// the plan through POST /api/v1/capacity/plan, once the revision has a profile (without one the API can only
// answer 400, so the page says what to do instead); Apply (operators, after a confirmation) scales each pool through
// POST /api/v1/capacity/plan/apply. Plain fetch; no framework.
(function () {
  "use strict";
  var root = document.getElementById("capacity");
  if (!root) { return; }
  var deployment = root.dataset.deployment;
  var mode = root.dataset.mode;
  var csrf = root.dataset.csrf;
  var lastPlan = null;
  var planSeq = 0;

  function api(method, url, body) {
    var options = {method: method, credentials: "same-origin",
                   headers: {"Accept": "application/json", "X-CSRFToken": csrf}};
    if (body !== undefined) {
      options.headers["Content-Type"] = "application/json";
      options.body = JSON.stringify(body);
    }
    return fetch(url, options).then(function (response) {
      return response.json().then(function (data) {
        if (!response.ok) {
          var message = (data && data.error && data.error.message) || ("HTTP " + response.status);
          throw new Error(message);
        }
        return data;
      });
    });
  }

  // --- profile section ---
  function profileBody() { return document.getElementById("profile-body"); }
  function hasProfile() { var body = profileBody(); return !!body && body.dataset.hasProfile === "1"; }

  function reloadProfiles() {
    // A finished profile run: its section (fits, plots, live checks) replaces the old one, and the plan follows.
    return fetch(root.dataset.profilesUrl, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (response) {
        if (!response.ok) { throw new Error("HTTP " + response.status); }
        return response.text();
      }).then(function (html) {
        var old = profileBody();
        var holder = document.createElement("div");
        holder.innerHTML = html;
        var fresh = holder.querySelector("#profile-body");
        if (window.Plotly) {
          Array.prototype.forEach.call(old.querySelectorAll(".chart"), function (div) { window.Plotly.purge(div); });
        }
        old.parentNode.replaceChild(fresh, old);
        drawProfiles();
        recompute();
      });
  }

  function drawProfiles() {
    var source = document.getElementById("profile-figures");
    if (!source || !window.Plotly) { return; }
    var figures = JSON.parse(source.textContent);
    var layouts = {
      prefill: {title: {text: "Prefill: latency vs batch tokens"}, xaxis: {title: {text: "tokens in the step"}},
                yaxis: {title: {text: "ms"}}},
      decode: {title: {text: "Decode: step (inter-token) time vs sequences"}, xaxis: {title: {text: "sequences"}},
               yaxis: {title: {text: "ms"}}}
    };
    ["prefill", "decode"].forEach(function (key) {
      var div = document.getElementById("chart-" + key);
      if (!div) { return; }
      // Measured points only (synthetic and live), not the fitted curves' samples.
      div.dataset.points = String(figures[key].reduce(function (n, t) {
        return n + (t.mode === "markers" ? t.x.length : 0); }, 0));
      window.Plotly.react(div, figures[key], Object.assign({height: 320, margin: {t: 40}}, layouts[key]),
                          {displayModeBar: false, responsive: true});
    });
  }

  // --- profile runs ---
  var jobBox = document.getElementById("profile-job");
  var progress = document.getElementById("profile-progress");
  var status = document.getElementById("profile-status");

  function pollJob(id, watched) {
    // `watched`: this page saw the job pending or running, so its end brings new profiles to show.
    api("GET", "/api/v1/profile-jobs/" + id).then(function (job) {
      jobBox.hidden = false;
      progress.value = job.progress;
      status.textContent = "job #" + job.id + ": " + job.status + " " + job.step + (job.error ? " — " + job.error : "");
      if (job.status === "pending" || job.status === "running") {
        setTimeout(function () { pollJob(id, true); }, 1000);
      } else if (job.status === "succeeded" && watched) {
        var done = status.textContent;
        status.textContent = done + " — loading the new profile…";
        reloadProfiles().then(function () {
          status.textContent = done + " — plots and plan updated";
          root.dataset.profileShown = job.id;
        }).catch(function (error) {
          status.textContent = done + " — the new profile could not be shown (" + error.message + "): reload the page";
        });
      }
    }).catch(function (error) { status.textContent = String(error.message || error); });
  }

  var start = document.getElementById("profile-start");
  if (start) {
    start.addEventListener("click", function () {
      var body = {quick: document.getElementById("profile-quick").checked,
                  allow_shared_host: document.getElementById("profile-shared").checked};
      api("POST", "/api/v1/deployments/" + deployment + "/profiles", body).then(function (job) {
        root.dataset.job = job.id;
        pollJob(job.id, true);
      }).catch(function (error) { jobBox.hidden = false; status.textContent = error.message; });
    });
  }
  if (root.dataset.job) { pollJob(root.dataset.job, false); }

  // --- planner ---
  var form = document.getElementById("plan-form");
  var state = document.getElementById("plan-state");
  var table = document.getElementById("plan-table");
  var why = document.getElementById("plan-why");
  var apply = document.getElementById("plan-apply");
  var applyResult = document.getElementById("apply-result");

  function value(name) { return parseFloat(form.elements[name].value); }

  function planBody() {
    var hours = form.elements.hours.value;
    var traffic = hours ? {hours: parseFloat(hours)} : {
      requests_per_s: value("requests_per_s"), prompt_tokens_mean: value("prompt_tokens_mean"),
      output_tokens_mean: value("output_tokens_mean")};
    return {deployment: deployment, traffic: traffic,
            objectives: {ttft_p99_s: value("ttft_p99_ms") / 1000, itl_p99_s: value("itl_p99_ms") / 1000},
            prices: {prefill: value("price_prefill"), decode: value("price_decode"),
                     colocated: value("price_colocated")},
            what_if: {traffic: value("what_traffic"), prompt_length: value("what_prompt")}};
  }

  function ms(seconds) {
    if (seconds === null || seconds === undefined) { return "–"; }
    return seconds >= 1 ? Number(seconds.toPrecision(3)) + " s" : Number((seconds * 1000).toPrecision(3)) + " ms";
  }
  function rate(perSecond) { return String(Number(perSecond.toPrecision(3))); }
  function pct(x) { return x === null || x === undefined ? "–" : Math.round(x * 100) + "%"; }
  function cell(text) { var td = document.createElement("td"); td.textContent = text; return td; }

  function show(plan) {
    var body = table.querySelector("tbody");
    body.textContent = "";
    Object.keys(plan.layouts).forEach(function (name) {
      var p = plan.layouts[name];
      var row = document.createElement("tr");
      row.dataset.layout = name;
      if (name === plan.recommended) { row.className = "ok"; }
      var replicas = Object.keys(p.replicas).map(function (r) { return r + " " + p.replicas[r]; }).join(", ");
      var util = p.predicted && p.predicted.utilisation ? Object.keys(p.predicted.utilisation).map(function (r) {
        return r + " " + pct(p.predicted.utilisation[r]); }).join(", ") : "–";
      row.appendChild(cell(name + (name === plan.recommended ? " ✓" : "")));
      row.appendChild(cell(p.feasible ? replicas : "infeasible: " + p.reason));
      row.appendChild(cell(p.feasible ? ms(p.predicted.ttft_p99_s) : "–"));
      row.appendChild(cell(p.feasible ? ms(p.predicted.itl_p99_s) : "–"));
      row.appendChild(cell(util));
      row.appendChild(cell(p.headroom === null ? "–" : "+" + pct(p.headroom)));
      row.appendChild(cell(p.cost_per_hour === null ? "–" : p.cost_per_hour.toFixed(2)));
      row.appendChild(cell(p.cost_per_million_tokens === null ? "–" : p.cost_per_million_tokens.toFixed(3)));
      row.querySelector("td:nth-child(2)").dataset.replicas = JSON.stringify(p.replicas);
      body.appendChild(row);
    });
    table.hidden = false;
    why.textContent = plan.why;
    if (apply) { apply.disabled = !(plan.layouts[mode] && plan.layouts[mode].feasible); }
  }

  function recompute() {
    document.getElementById("traffic-out").textContent = form.elements.what_traffic.value;
    document.getElementById("prompt-out").textContent = form.elements.what_prompt.value;
    document.getElementById("itl-out").textContent = form.elements.itl_p99_ms.value;
    var seq = ++planSeq;
    if (!hasProfile()) {
      table.hidden = true;
      why.textContent = "";
      if (apply) { apply.disabled = true; }
      state.textContent = "No plan yet: the planner needs a profile of this revision (see Profiles above). " +
        "The plan is computed here when the profile run finishes.";
      root.dataset.planState = "no-profile";
      return;
    }
    state.textContent = "computing…";
    root.dataset.planState = "computing";
    api("POST", "/api/v1/capacity/plan", planBody()).then(function (plan) {
      if (seq !== planSeq) { return; }  // a newer input won
      lastPlan = plan;
      show(plan);
      state.textContent = "for " + rate(plan.traffic.requests_per_s) + " requests/s, prompts of " +
        Math.round(plan.traffic.prompt_tokens_mean) + " tokens, TTFT P99 ≤ " + ms(plan.objectives.ttft_p99_s) +
        ", ITL P99 ≤ " + ms(plan.objectives.itl_p99_s) +
        (Number(profileBody().dataset.disagrees) ? " (from a profile live traffic contradicts: see above)" : "");
      root.dataset.planState = "ready";
    }).catch(function (error) {
      if (seq !== planSeq) { return; }
      lastPlan = null;
      table.hidden = true;
      why.textContent = "";
      if (apply) { apply.disabled = true; }
      state.textContent = error.message;
      root.dataset.planState = "error";
    });
  }

  var timer = null;
  form.addEventListener("input", function () {
    // The plan shown, or one still on its way, is for the old inputs from now on: drop it when it comes back.
    planSeq++;
    root.dataset.planState = "pending";
    clearTimeout(timer);
    timer = setTimeout(recompute, 250);
  });
  form.addEventListener("submit", function (event) { event.preventDefault(); recompute(); });

  if (apply) {
    apply.addEventListener("click", function () {
      if (!lastPlan || !lastPlan.layouts[mode]) { return; }
      var replicas = lastPlan.layouts[mode].replicas;
      var text = Object.keys(replicas).map(function (r) {
        return r + ": " + (lastPlan.current_replicas[r] === undefined ? "?" : lastPlan.current_replicas[r]) + " → " +
          replicas[r]; }).join(", ");
      if (!window.confirm("Scale " + deployment + " (" + text + ")? Each pool's change is an audited scale action.")) {
        return;
      }
      api("POST", "/api/v1/capacity/plan/apply", {deployment: deployment, replicas: replicas,
                                                  reason: "capacity plan from the capacity page"})
        .then(function (result) {
          applyResult.textContent = "applied: " + result.actions.map(function (a) {
            return a.role + " " + a.from + " → " + a.to + " (action #" + a.id + ")"; }).join(", ");
        }).catch(function (error) { applyResult.textContent = error.message; });
    });
  }

  window.addEventListener("load", drawProfiles);
  if (document.readyState === "complete") { drawProfiles(); }
  recompute();
})();
