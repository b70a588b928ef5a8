// The gpushare admin page: polls api/v1/admin/overview and draws it (no library).
(function () {
  const root = document.getElementById("gpushare-admin");
  const pollMs = Number(root.dataset.pollMs || 2000);
  const esc = (s) => String(s == null ? "" : s).replace(/[&<>"']/g,
    (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const palette = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                   "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
  // each team its own colour, in the policy's order (a hash could give two teams one colour)
  let teamOrder = new Map();
  const colour = (team) => {
    if (!teamOrder.has(team)) teamOrder.set(team, teamOrder.size);
    return palette[teamOrder.get(team) % palette.length];
  };
  const gib = (mib) => (mib / 1024).toFixed(mib >= 10240 ? 0 : 1) + " GiB";
  // number text: `d` decimals at most, trailing zeros of the FRACTION dropped (2000 stays
  // 2000, 0.50 is 0.5, -0.00 is 0); tests/test_trust_figures.py runs this block in node
  // BEGIN n
  const n = (x, d = 2) => {
    if (x == null || x === "") return "";
    const text = Number(x).toFixed(d);
    const out = text.includes(".") ? text.replace(/0+$/, "").replace(/\.$/, "") : text;
    return out === "-0" ? "0" : out;
  };
  // END n
  // a time from the broker (ISO 8601, UTC) in the reader's local time, with the zone
  const when = (iso) => {
    const d = new Date(iso || "");
    if (!iso || isNaN(d)) return esc(iso);
    return `<time datetime="${esc(iso)}">${esc(d.toLocaleString(undefined, {month: "short",
      day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit",
      timeZoneName: "short"}))}</time>`;
  };
  let last = "";
  let error = "";

  function gpuHtml(gpu) {
    const segs = gpu.holders.map((h) => {
      const share = Math.max(h.memory_mib / gpu.memory_mib, h.compute_pct / 100);
      const cls = ["seg", h.borrowed ? "borrowed" : "", h.preempting ? "preempting" : "",
                   h.idle_warned ? "idle" : ""].join(" ");
      const tip = `${h.user} (${h.team}) ${gib(h.memory_mib)}, ${n(h.compute_pct, 1)} % compute` +
        `${h.borrowed ? ", borrowed" : ""}${h.preempting ? ", being preempted" : ""}` +
        `${h.idle_warned ? ", warned: idle" : ""} [${h.kind}${h.profile ? " " + h.profile : ""}]`;
      return `<div class="${cls}" data-user="${esc(h.user)}" data-grant="${esc(h.grant_id)}"` +
        ` style="width:${(100 * Math.min(1, share)).toFixed(2)}%;background-color:` +
        `${colour(h.team)}" title="${esc(tip)}"></div>`;
    }).join("");
    const used = gpu.holders.reduce((a, h) => a + h.memory_mib, 0);
    return `<div class="gpu" data-uuid="${esc(gpu.uuid)}"><div>#${gpu.index} ${esc(gpu.model)}` +
      `${gpu.simulated ? " (simulated)" : ""}: ${gib(used)} of ${gib(gpu.memory_mib)}, ` +
      `${gpu.holders.length} grant(s)</div><div class="bar">${segs}</div>` +
      holdersHtml(gpu) + "</div>";
  }

  // who holds a GPU, written out under its bar (not only in the tooltip)
  function holdersHtml(gpu) {
    if (!gpu.holders.length) return '<ul class="holders"><li class="free">free</li></ul>';
    return '<ul class="holders">' + gpu.holders.map((h) => {
      const tags = [h.borrowed ? "borrowed" : "", h.preempting ? "being preempted" : "",
                    h.idle_warned ? "idle" : ""].filter(Boolean);
      return `<li data-grant="${esc(h.grant_id)}"><i class="swatch" style="background-color:` +
        `${colour(h.team)}"></i><b>${esc(h.user)}</b> ${esc(h.team)} &middot; ` +
        `${esc(h.server || h.kind)} &middot; ${gib(h.memory_mib)}` +
        (tags.length ? ` <em>${esc(tags.join(", "))}</em>` : "") + "</li>";
    }).join("") + "</ul>";
  }

  // what the colours and marks of the GPU bars mean
  function legendHtml(teams) {
    const names = [...new Set(teams.map((t) => t.team))];
    return '<div class="legend" id="legend">' + names.map((t) =>
      `<span data-team="${esc(t)}"><i class="swatch" style="background-color:${colour(t)}">` +
      `</i>${esc(t)}</span>`).join("") +
      '<span><i class="swatch seg borrowed" style="background-color:#888"></i>borrowed ' +
      "(above the team's guarantee; may be preempted)</span>" +
      '<span><i class="swatch seg preempting" style="background-color:#888"></i>being ' +
      "preempted</span>" +
      '<span><i class="swatch seg idle" style="background-color:#888"></i>warned: idle</span>' +
      '<span><i class="swatch" style="background-color:#eee"></i>free</span></div>';
  }

  function nodesHtml(nodes) {
    return nodes.map((node) => `<section class="node${node.drained ? " drained" : ""}"` +
      ` data-node="${esc(node.name)}"><header><b>${esc(node.name)}</b>` +
      `<span>pool ${esc(node.pool)}</span>` +
      (node.drained ? '<span class="badge">drained</span>' : "") +
      `<button data-action="${node.drained ? "resume" : "drain"}" data-node="${esc(node.name)}">` +
      `${node.drained ? "Resume" : "Drain"}</button></header>` +
      `<div class="gpus">${node.gpus.map(gpuHtml).join("")}</div></section>`).join("");
  }

  function table(cls, head, rows) {
    return `<table class="${cls}"><thead><tr>${head.map((h) => `<th>${esc(h)}</th>`).join("")}` +
      `</tr></thead><tbody>${rows.join("") || `<tr><td colspan="${head.length}">none</td></tr>`}` +
      "</tbody></table>";
  }

  function teamsHtml(teams) {
    return table("teams", ["team", "pool", "in use", "guaranteed", "borrow limit", "borrowed",
                           "use / (guarantee + borrow)", "GPU-h this month", "budget"],
      teams.map((t) => {
        const top = t.guaranteed + t.borrow_limit || 1;
        return `<tr data-team="${esc(t.team)}" data-pool="${esc(t.pool)}">` +
          `<td>${esc(t.team)}</td><td>${esc(t.pool)}</td><td class="num">${n(t.in_use, 3)}</td>` +
          `<td class="num">${n(t.guaranteed, 3)}</td><td class="num">${n(t.borrow_limit, 3)}</td>` +
          `<td class="num">${n(t.borrowed, 3)}</td><td><span class="use">` +
          `<i style="width:${(100 * Math.min(1, t.in_use / top)).toFixed(1)}%"></i>` +
          `<s style="left:${(100 * t.guaranteed / top).toFixed(1)}%"></s></span></td>` +
          `<td class="num">${n(t.gpu_hours_month, 1)}</td>` +
          `<td class="num">${t.gpu_hours_budget == null ? "" : n(t.gpu_hours_budget, 3)}</td></tr>`;
      }));
  }

  // the queue: what waits (the job's name, else the server), and a Cancel per request
  function queueHtml(queue) {
    return table("queue", ["position", "user", "team", "pool", "job / server", "GPUs",
                           "priority", "status", "reason", "since", ""],
      queue.map((q) => `<tr data-request="${esc(q.request_id)}"><td class="num">` +
        `${q.position == null ? "" : q.position}</td><td>${esc(q.user)}</td><td>${esc(q.team)}` +
        `</td><td>${esc(q.pool)}</td><td class="holder">${esc(q.job_name || q.server || "")}` +
        `${q.kind === "batch" ? ' <span class="kind">job</span>' : ""}</td>` +
        `<td class="num">${n(q.units, 3)}</td>` +
        `<td>${esc(q.priority)}</td><td>${esc(q.status)}</td><td>${esc(q.reason)}</td>` +
        `<td>${when(q.created_at)}</td><td><button data-cancel="${esc(q.request_id)}" ` +
        `data-user="${esc(q.user)}" data-what="${esc(q.job_name || q.server || "")}">Cancel` +
        "</button></td></tr>"));
  }

  function render(d) {
    teamOrder = new Map(d.teams.map((t) => t.team).filter((t, i, a) => a.indexOf(t) === i)
      .map((t, i) => [t, i]));
    const busy = d.nodes.reduce((a, nd) => a + nd.gpus.filter((g) => g.holders.length).length, 0);
    const total = d.nodes.reduce((a, nd) => a + nd.gpus.length, 0);
    root.innerHTML =
      `<p class="meta">Policy version <code id="policy-version">${esc(d.policy_version)}</code>` +
      ` &middot; ${d.grants} live grant(s) &middot; ${busy} of ${total} GPUs in use &middot; ` +
      `updated <span id="updated">${when(d.now)}</span>` +
      (error ? ` <span class="err">${esc(error)}</span>` : "") + "</p>" +
      // the monthly report as a page (its advice checked by a replay of the month)
      '<p class="meta">Monthly report: <a id="report-link" href="report">last month</a>' +
      ` &middot; <a id="report-now-link" href="report?month=${new Date().toISOString().slice(0, 7)}">` +
      "this month so far (partial)</a></p>" +
      "<h2>Pools</h2>" + table("pools", ["pool", "mode", "capacity", "in use"],
        d.pools.map((p) => `<tr><td>${esc(p.pool)}</td><td>${esc(p.mode)}</td>` +
          `<td class="num">${n(p.capacity, 3)}</td><td class="num">${n(p.in_use, 3)}</td></tr>`)) +
      "<h2>Teams: use against guarantee, borrow limit and budget</h2>" + teamsHtml(d.teams) +
      `<h2>Queue (${d.queue.length})</h2>` + queueHtml(d.queue) +
      `<h2>GPUs (${total})</h2>${legendHtml(d.teams)}<div id="nodes">${nodesHtml(d.nodes)}</div>` +
      "<h2>Recent preemptions</h2>" + table("preemptions",
        ["at", "user", "team", "pool", "node", "borrowed", "for team", "reason"],
        d.preemptions.map((p) => `<tr><td>${when(p.at)}</td><td>${esc(p.user)}</td>` +
          `<td>${esc(p.team)}</td><td>${esc(p.pool)}</td><td>${esc(p.node)}</td>` +
          `<td>${p.borrowed ? "yes" : "no"}</td><td>${esc(p.by_team)}</td>` +
          `<td>${esc(p.reason)}</td></tr>`)) +
      "<h2>Recent refusals</h2>" + table("refusals",
        ["at", "user", "team", "pool", "code", "reason"],
        d.refusals.map((r) => `<tr><td>${when(r.at)}</td><td>${esc(r.user)}</td>` +
          `<td>${esc(r.team)}</td><td>${esc(r.pool)}</td><td>${esc(r.code)}</td>` +
          `<td>${esc(r.reason)}</td></tr>`)) +
      "<h2>GPU idle culler</h2>" + table("culls", ["at", "user", "server", "pool", "event",
                                                     "idle (s)"],
        d.culls.map((c) => `<tr><td>${when(c.ts)}</td><td>${esc(c.user)}</td>` +
          `<td>${esc(c.server)}</td><td>${esc(c.pool)}</td><td>${esc(c.event)}</td>` +
          `<td class="num">${n(c.idle_s, 0)}</td></tr>`));
  }

  async function poll() {
    try {
      const d = await gpushare.api("GET", "/admin/overview");
      const text = JSON.stringify(d);
      error = "";
      if (text !== last) {
        last = text;
        render(d);
        root.dataset.loaded = String(Date.now());
      }
    } catch (e) {
      error = `update failed: ${e.status || ""} ${e.message}`;
      const meta = root.querySelector(".meta");
      if (meta) meta.dataset.error = error;
    }
    setTimeout(poll, pollMs);
  }

  // a confirmation in the page (a <dialog>): resolves true when the admin confirms
  function confirmAction(text, okLabel) {
    let dlg = document.getElementById("gpushare-confirm");
    if (!dlg) {
      dlg = document.createElement("dialog");
      dlg.id = "gpushare-confirm";
      dlg.innerHTML = '<p class="text"></p><form method="dialog"><button value="no" ' +
        'id="confirm-no">Keep as is</button> <button value="yes" id="confirm-yes"></button>' +
        "</form>";
      document.body.appendChild(dlg);
    }
    dlg.querySelector(".text").textContent = text;
    dlg.querySelector("#confirm-yes").textContent = okLabel;
    dlg.returnValue = "";
    return new Promise((resolve) => {
      dlg.addEventListener("close", () => resolve(dlg.returnValue === "yes"), {once: true});
      dlg.showModal();
    });
  }

  root.addEventListener("click", async (ev) => {
    const c = ev.target.closest("button[data-cancel]");
    if (c) {
      const ok = await confirmAction(`Cancel ${c.dataset.user}'s waiting request` +
        `${c.dataset.what ? " for " + c.dataset.what : ""}? It leaves the queue; its status ` +
        "becomes cancelled.", "Cancel the request");
      if (!ok) return;
      c.disabled = true;
      try {
        await gpushare.api("POST", `/admin/requests/${encodeURIComponent(c.dataset.cancel)}/cancel`);
        last = "";
      } catch (e) {
        alert(`cancel: ${e.status} ${e.message}`);
        c.disabled = false;
      }
      return;
    }
    const b = ev.target.closest("button[data-action]");
    if (!b) return;
    if (b.dataset.action === "drain") {
      const ok = await confirmAction(`Drain ${b.dataset.node}? No new grant is placed on it; ` +
        "the grants it holds keep running until released. Resume undoes it.",
        `Drain ${b.dataset.node}`);
      if (!ok) return;
    }
    b.disabled = true;
    try {
      await gpushare.api("POST", `/admin/nodes/${encodeURIComponent(b.dataset.node)}/` +
                         b.dataset.action);
      last = "";
    } catch (e) {
      alert(`${b.dataset.action} ${b.dataset.node}: ${e.status} ${e.message}`);
    }
    b.disabled = false;
  });

  // gpushare.api is defined by the page's footer script, after this one: start once loaded
  window.addEventListener("DOMContentLoaded", poll);
})();
