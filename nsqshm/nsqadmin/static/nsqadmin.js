/* nsqadmin pages: live refresh, the message-rate chart and the admin actions.
 *
 * Every page is complete as the server renders it.  This script
 *  - refreshes the #live part in place (the page fetched again with ?partial=1),
 *  - polls the JSON API named by the chart's data-api and draws messages/s,
 *  - sends the actions of [data-action] buttons to the JSON API, asking for
 *    confirmation before the destructive ones (empty, delete, tombstone, a
 *    log channel's reset to a position: setoffset, a cluster node's removal,
 *    a replicated partition's move).
 * No libraries, no build step. */
(function () {
  "use strict";

  var body = document.body;
  var base = (body.getAttribute("data-base") || "/").replace(/\/+$/, "");
  var refreshMs = parseInt(body.getAttribute("data-refresh"), 10) || 2000;
  var live = document.getElementById("live");
  var flash = document.getElementById("flash");
  var canvas = document.getElementById("rate-chart");
  var DESTRUCTIVE = { empty: true, delete: true, tombstone: true, setoffset: true };
  // the Nodes page's cluster buttons -> the action POSTed to /api/cluster/nodes/:id
  var NODE_ACTIONS = { "remove-node": "remove", "restore-node": "restore" };
  // the topic page's replication buttons -> the action POSTed to /api/cluster/topics/:t/:p
  var MOVE_ACTIONS = { "move-leader": "move_leader", "move-replica": "move_replica" };
  var movesPending = {};  // "topic/partition" -> true while nsqlookupd works on a move
  var MAX_POINTS = 60;

  function apiUrl(path) { return base + path; }
  function enc(name) { return encodeURIComponent(name); }

  function showFlash(kind, text) {
    var div = document.createElement("div");
    div.className = "alert " + kind;
    div.setAttribute("role", "alert");
    div.textContent = text;
    flash.replaceChildren(div);
  }

  // -- live refresh -------------------------------------------------------------

  // A button pressed but not yet released is not replaced: a click is a
  // mousedown and a mouseup on the same element, and a refresh between them
  // would swallow it (the reset a user pressed would not be sent).  A press
  // whose release never comes (let go outside the window) holds it 2 s at most.
  var pressedAt = 0;
  document.addEventListener("pointerdown", function () { pressedAt = Date.now(); }, true);
  ["pointerup", "pointercancel"].forEach(function (kind) {
    document.addEventListener(kind, function () {
      window.setTimeout(function () { pressedAt = 0; }, 0);  // after the click event
    }, true);
  });
  function pressed() { return pressedAt !== 0 && Date.now() - pressedAt < 2000; }

  var refreshing = false;
  var refreshes = 0;
  function refreshLive() {
    if (!live || refreshing) { return Promise.resolve(); }
    refreshing = true;
    var params = new URLSearchParams(window.location.search);
    params.set("partial", "1");
    return fetch(window.location.pathname + "?" + params.toString(), { cache: "no-store" })
      .then(function (resp) { return resp.text(); })
      .then(function (html) {
        if (pressed()) { return; }  // the next tick refreshes
        var picked = document.getElementById("reset-time");  // a time being chosen stays
        var kept = picked ? picked.value : "";
        var choices = {};  // and what a [data-keep] select has chosen (a replica's move)
        live.querySelectorAll("select[data-keep]").forEach(function (el) {
          choices[el.id] = el.value;
        });
        live.innerHTML = html;
        picked = document.getElementById("reset-time");
        if (picked && kept) { picked.value = kept; }
        // a partition's move buttons stay disabled while its move is under way
        live.querySelectorAll("[data-partition]").forEach(function (el) {
          if (movesPending[el.getAttribute("data-topic") + "/" +
                           el.getAttribute("data-partition")]) { el.disabled = true; }
        });
        Object.keys(choices).forEach(function (id) {
          var el = document.getElementById(id);
          if (el && Array.prototype.some.call(el.options, function (o) {
            return o.value === choices[id];
          })) { el.value = choices[id]; }
        });
        refreshes += 1;
        live.setAttribute("data-refreshes", String(refreshes));
      })
      .catch(function () { /* the next tick tries again */ })
      .then(function () { refreshing = false; });
  }

  // -- rate chart ---------------------------------------------------------------

  var rates = [];
  var last = null;

  function countOf(kind, doc) {
    if (kind === "counter") {
      var total = 0;
      Object.keys(doc.stats || {}).forEach(function (k) { total += doc.stats[k].message_count; });
      return total;
    }
    return typeof doc[kind] === "number" ? doc[kind] : null;
  }

  function formatRate(r) {
    return r >= 100 ? Math.round(r).toLocaleString() : r.toFixed(1);
  }

  function drawChart() {
    var ctx = canvas.getContext("2d");
    var w = canvas.width, h = canvas.height, pad = 28;
    ctx.clearRect(0, 0, w, h);
    ctx.strokeStyle = "#d8dde6";
    ctx.lineWidth = 1;
    for (var g = 0; g <= 4; g++) {
      var gy = pad / 2 + (h - pad) * g / 4;
      ctx.beginPath(); ctx.moveTo(pad, gy); ctx.lineTo(w - 4, gy); ctx.stroke();
    }
    var max = Math.max.apply(null, rates.concat([1]));
    ctx.fillStyle = "#6b7280";
    ctx.font = "11px sans-serif";
    ctx.fillText(formatRate(max), 2, pad / 2 + 4);
    ctx.fillText("0", 2, h - pad / 2 + 4);
    if (rates.length < 1) { return; }
    var step = (w - pad - 4) / (MAX_POINTS - 1);
    var x0 = w - 4 - step * (rates.length - 1);
    ctx.beginPath();
    rates.forEach(function (r, i) {
      var x = x0 + step * i;
      var y = h - pad / 2 - (h - pad) * r / max;
      if (i === 0) { ctx.moveTo(x, y); } else { ctx.lineTo(x, y); }
    });
    ctx.strokeStyle = "#2563eb";
    ctx.lineWidth = 2;
    ctx.stroke();
  }

  function pollChart() {
    var kind = canvas.getAttribute("data-kind");
    return fetch(apiUrl(canvas.getAttribute("data-api")), { cache: "no-store" })
      .then(function (resp) { return resp.ok ? resp.json() : null; })
      .then(function (doc) {
        var count = doc ? countOf(kind, doc) : null;
        if (count === null) { return; }
        var now = Date.now();
        if (last !== null && now > last.t) {
          var rate = Math.max(0, (count - last.count) * 1000 / (now - last.t));
          rates.push(rate);
          if (rates.length > MAX_POINTS) { rates.shift(); }
          document.getElementById("rate-now").textContent = formatRate(rate);
          document.getElementById("rate-window").textContent = String(rates.length);
          canvas.setAttribute("data-points", String(rates.length));
          canvas.setAttribute("data-last-rate", String(rate));
        }
        last = { t: now, count: count };
        drawChart();
      })
      .catch(function () { /* the next tick tries again */ });
  }

  // -- actions ------------------------------------------------------------------

  function describe(topic, channel) {
    return channel ? "channel " + topic + "/" + channel : "topic " + topic;
  }

  function send(method, path, doc) {
    var init = { method: method, headers: { "Content-Type": "application/json" } };
    if (doc) { init.body = JSON.stringify(doc); }
    return fetch(apiUrl(path), init).then(function (resp) {
      return resp.json().catch(function () { return {}; }).then(function (answer) {
        return { ok: resp.ok, status: resp.status, message: answer.message || "" };
      });
    });
  }

  function afterAction(result, next) {
    if (!result.ok) {
      showFlash("error", result.status + " " + (result.message || "request failed"));
      return;
    }
    if (result.message) { showFlash("warning", result.message); } else { flash.replaceChildren(); }
    if (next) { window.location.href = next; } else { refreshLive(); }
  }

  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest("[data-action]");
    if (!btn) { return; }
    ev.preventDefault();
    var action = btn.getAttribute("data-action");
    var topic = btn.getAttribute("data-topic");
    var channel = btn.getAttribute("data-channel");
    var node = btn.getAttribute("data-node");
    var next = btn.getAttribute("data-next");
    var position = btn.getAttribute("data-position");
    if (position === "time") {  // the reset form's time, in the browser's time zone
      var ms = Date.parse(document.getElementById("reset-time").value);
      if (isNaN(ms)) { showFlash("error", "choose a time to reset to"); return; }
      position = "timestamp:" + Math.floor(ms / 1000);
    }
    // a partition's move: a leadership to data-to, or the replica its selects name
    var partition = btn.getAttribute("data-partition");
    var from = btn.getAttribute("data-from"), to = btn.getAttribute("data-to");
    if (action === "move-replica") {
      from = document.getElementById("move-from-" + partition).value;
      to = document.getElementById("move-to-" + partition).value;
    }
    if (action === "setoffset") {
      if (!window.confirm("Are you sure you want to reset " + describe(topic, channel) +
                          " to " + position + "?")) { return; }
    } else if (MOVE_ACTIONS[action]) {
      var moved = action === "move-leader" ? "the leadership" : "the replica on " + from;
      if (!window.confirm("Are you sure you want to move " + moved + " of " + topic +
                          " partition " + partition + " to " + to + "?")) { return; }
      showFlash("notice", "moving " + moved + " of " + topic + " partition " + partition +
                " to " + to + " (nsqlookupd answers once it is done)");
    } else if (action === "remove-node") {
      if (!window.confirm("Are you sure you want to remove node " + node +
                          " from the cluster?")) { return; }
    } else if (DESTRUCTIVE[action]) {
      var what = action === "tombstone" ? "node " + node + " for topic " + topic
                                          : describe(topic, channel);
      if (!window.confirm("Are you sure you want to " + action + " " + what + "?")) { return; }
    }
    var path = "/api/topics/" + enc(topic) + (channel ? "/" + enc(channel) : "");
    var request;
    if (MOVE_ACTIONS[action]) {
      request = send("POST", "/api/cluster/topics/" + enc(topic) + "/" + enc(partition),
                     { action: MOVE_ACTIONS[action], from: from, to: to });
    } else if (NODE_ACTIONS[action]) {
      request = send("POST", "/api/cluster/nodes/" + enc(node), { action: NODE_ACTIONS[action] });
    } else if (action === "tombstone") {
      request = send("DELETE", "/api/nodes/" + enc(node), { topic: topic });
    } else if (action === "delete") {
      request = send("DELETE", path, null);
    } else if (action === "setoffset") {
      request = send("POST", path, { action: action, position: position });
    } else {
      request = send("POST", path, { action: action });
    }
    btn.disabled = true;
    var moveKey = MOVE_ACTIONS[action] ? topic + "/" + partition : null;
    if (moveKey) { movesPending[moveKey] = true; }
    request.then(function (result) {
      btn.disabled = false;
      if (moveKey) { delete movesPending[moveKey]; }
      afterAction(result, action === "delete" ? next : "");
    }, function () {
      btn.disabled = false;
      if (moveKey) { delete movesPending[moveKey]; }
      showFlash("error", "nsqadmin did not answer");
    });
  });

  // the policy page (issue 18): redrive buttons and the policy forms
  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest("[data-redrive]");
    if (!btn) { return; }
    ev.preventDefault();
    var n = btn.getAttribute("data-redrive");
    var path = "/api/topics/" + enc(btn.getAttribute("data-topic")) + "/" +
               enc(btn.getAttribute("data-channel")) + "/redrive";
    btn.disabled = true;
    var doc = n === "all" ? {} : n === "id" ? { id: btn.getAttribute("data-id") } : { n: n };
    send("POST", path, doc).then(function (result) {
      btn.disabled = false;
      afterAction(result, "");
    }, function () {
      btn.disabled = false;
      showFlash("error", "nsqadmin did not answer");
    });
  });

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form.classList.contains("policy-form")) { return; }
    ev.preventDefault();
    var doc = { of: form.getAttribute("data-of") };
    Array.prototype.forEach.call(form.elements, function (el) {
      if (el.name && el.value) { doc[el.name] = el.value; }
    });
    var path = doc.of === "topic" ? "/api/policies/" + enc(form.getAttribute("data-topic"))
      : "/api/topics/" + enc(form.getAttribute("data-topic")) + "/" +
        enc(form.getAttribute("data-channel")) + "/policy";
    send("POST", path, doc).then(function (result) {
      afterAction(result, "");
      if (result.ok) { form.reset(); }
    });
  });

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (form.id !== "create-form") { return; }
    ev.preventDefault();
    var doc = { topic: form.elements.topic.value, channel: form.elements.channel.value };
    send("POST", "/api/topics", doc).then(function (result) {
      afterAction(result, "");
      if (result.ok) { form.reset(); }
    });
  });

  // -- the clock ------------------------------------------------------------------

  function tick() {
    if (document.hidden) { return; }  // a background tab asks nothing of the cluster
    refreshLive();
    if (canvas) { pollChart(); }
  }
  if (canvas) { drawChart(); pollChart(); }
  window.setInterval(tick, refreshMs);
}());
