// jobsystem dashboard: live updates (the page's content fetched again every few seconds) and
// actions (JSON POSTs carrying the CSRF token). No framework, nothing from a CDN.
"use strict";
(function () {
  const main = document.getElementById("content");
  const token = document.querySelector('meta[name="csrf-token"]').content;
  const live = document.getElementById("live");
  const selected = new Map(); // message id -> queue, kept across refreshes of the dead letters page

  function toast(text, bad) {
    const box = document.getElementById("toast");
    const msg = document.createElement("div");
    msg.className = "msg" + (bad ? " bad" : "");
    msg.textContent = text;
    box.appendChild(msg);
    setTimeout(() => msg.remove(), 8000);
  }

  async function post(url, body) {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": token },
      body: JSON.stringify(body),
    });
    const data = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(data.error || response.status + " " + response.statusText);
    return data;
  }

  function notes(data) {
    return data.notes && data.notes.length ? " (" + data.notes.join("; ") + ")" : "";
  }

  function summary(data) {
    return Object.entries(data).filter(([, v]) => typeof v === "number")
      .map(([k, v]) => k + " " + v).join(", ");
  }

  async function act(url, body, confirmText) {
    if (confirmText && !window.confirm(confirmText)) return;
    try {
      const data = await post(url, body);
      toast((data.stopped ? "stopped: " : "done: ") + summary(data) + notes(data), Boolean(data.stopped));
      selected.clear();
      refresh();
    } catch (error) {
      toast("refused: " + error.message, true);
    }
  }

  function selectionOps() {
    const groups = new Map();
    for (const [id, queue] of selected) {
      if (!groups.has(queue)) groups.set(queue, []);
      groups.get(queue).push(id);
    }
    return groups;
  }

  async function actOnSelection(op) {
    const groups = selectionOps();
    if (!window.confirm(op + " " + selected.size + " selected dead letter(s)?")) return;
    const totals = {};
    let stopped = null; // the answer of a queue's action that stopped before the end, with its notes
    try {
      for (const [queue, ids] of groups) {
        const data = await post("/api/dead-letters/" + op, { queue: queue, ids: ids });
        for (const [k, v] of Object.entries(data)) if (typeof v === "number") totals[k] = (totals[k] || 0) + v;
        if (data.stopped) { stopped = data; break; } // the next queues' are left as they are
      }
      toast((stopped ? "stopped: " : "done: ") + summary(totals) + (stopped ? notes(stopped) : ""), Boolean(stopped));
    } catch (error) {
      toast("refused: " + error.message, true);
    }
    selected.clear();
    refresh();
  }

  function wire() {
    main.querySelectorAll("button.act").forEach((button) => {
      button.addEventListener("click", () =>
        act(button.dataset.url, JSON.parse(button.dataset.body || "{}"), button.dataset.confirm));
    });
    const bar = document.getElementById("dl-actions");
    if (!bar) return;
    const picks = main.querySelectorAll("input.pick");
    picks.forEach((box) => {
      box.checked = selected.has(box.value);
      box.addEventListener("change", () => {
        if (box.checked) selected.set(box.value, box.dataset.queue); else selected.delete(box.value);
        update();
      });
    });
    const all = document.getElementById("select-page");
    if (all) all.addEventListener("change", () => {
      picks.forEach((box) => {
        box.checked = all.checked;
        if (all.checked) selected.set(box.value, box.dataset.queue); else selected.delete(box.value);
      });
      update();
    });
    bar.querySelectorAll("button.selection").forEach((button) =>
      button.addEventListener("click", () => actOnSelection(button.dataset.op)));
    bar.querySelectorAll("button.matching").forEach((button) =>
      button.addEventListener("click", () => {
        const filter = JSON.parse(bar.dataset.filter);
        const body = { all: true };
        for (const [k, v] of Object.entries(filter)) if (v) body[k] = v;
        const what = Object.entries(body).filter(([k]) => k !== "all").map(([k, v]) => k + "=" + v).join(", ");
        act("/api/dead-letters/" + button.dataset.op, body,
          button.dataset.op + " every dead letter matching " + (what || "(no filter: all of them)") + "?");
      }));
    function update() {
      bar.querySelectorAll("button.selection").forEach((b) => { b.disabled = selected.size === 0; });
      const count = document.getElementById("selected-count");
      if (count) count.textContent = selected.size ? selected.size + " selected" : "";
    }
    update();
  }

  let busy = false;
  async function refresh() {
    if (busy) return;
    const active = document.activeElement;
    if (active && main.contains(active) && /INPUT|SELECT|TEXTAREA/.test(active.tagName) && active.type !== "checkbox") return;
    busy = true;
    try {
      const url = new URL(window.location.href);
      url.searchParams.set("fragment", "1");
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
      if (!response.ok && response.status !== 404 && response.status !== 503) throw new Error(String(response.status));
      main.innerHTML = await response.text();
      wire();
      live.classList.remove("stale");
      live.textContent = "live";
    } catch (error) {
      live.classList.add("stale");
      live.textContent = "stale";
    } finally {
      busy = false;
    }
  }

  wire();
  const every = parseInt(main.dataset.refresh || "3000", 10);
  if (every > 0) setInterval(refresh, every);
})();
