// The console's only script: local times; on a run's page the live tail of its events, the
// progress of running calls, and a fresh copy of the steps whenever the run changes; on the
// approvals page a fresh copy of what waits, every two seconds. A part being typed in is never
// replaced under the visitor's fingers: its refresh waits until they leave it.
"use strict";

// Whether the visitor is filling in a form inside `part`.
function editing(part) {
  const el = document.activeElement;
  return !!el && part.contains(el) && ["INPUT", "TEXTAREA", "SELECT"].includes(el.tagName);
}

// Event rows a run's page keeps; older ones are a `kernelctl runs events` away.
const MAX_ROWS = 1000;

function pad(n, width) { return String(n).padStart(width || 2, "0"); }

function formatTimes(root) {
  for (const el of (root || document).querySelectorAll("time[data-ms]")) {
    const d = new Date(Number(el.dataset.ms));
    el.textContent = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
    el.title = d.toISOString();
  }
}

function followRun(events) {
  const live = document.getElementById("live");
  const tbody = events.querySelector("tbody");
  const progress = new Map();
  let next = Number(events.dataset.next);
  let source = null;
  let refreshing = false;
  let wanted = false;
  let last = 0;

  function showProgress() {
    for (const [key, p] of progress) {
      const el = live.querySelector(`[data-progress="${CSS.escape(key)}"]`);
      if (!el) continue;
      el.textContent = "";
      if (p.total > 0) {
        const bar = document.createElement("progress");
        bar.max = p.total;
        bar.value = p.current;
        el.append(bar, `${p.current}/${p.total} `);
      }
      el.append(p.message || "");
      el.title = p.message || "";
    }
  }

  async function refresh() {
    if (refreshing) { wanted = true; return; }
    if (editing(live)) { wanted = true; setTimeout(refresh, 1000); return; }
    const wait = 1000 - (Date.now() - last);
    if (wait > 0) { wanted = true; setTimeout(refresh, wait); return; }
    refreshing = true;
    wanted = false;
    last = Date.now();
    try {
      const response = await fetch(live.dataset.src, { credentials: "same-origin" });
      if (response.ok) {
        const open = new Set([...live.querySelectorAll("details[open]")].map((d) => d.dataset.key));
        live.innerHTML = await response.text();
        for (const d of live.querySelectorAll("details[data-key]")) {
          if (open.has(d.dataset.key)) d.open = true;
        }
        formatTimes(live);
        showProgress();
      }
    } finally {
      refreshing = false;
      if (wanted) setTimeout(refresh, 1000);
    }
  }

  function connect() {
    source = new EventSource(`/runs/${encodeURIComponent(events.dataset.run)}/stream?from=${next}`);
    source.onmessage = (message) => {
      const batch = JSON.parse(message.data);
      if (batch.rows) {
        tbody.insertAdjacentHTML("beforeend", batch.rows);
        // A page left open on a busy run keeps the newest rows only, so it stays light.
        while (tbody.rows.length > MAX_ROWS) tbody.deleteRow(0);
        formatTimes(tbody);
        next = Math.max(next, batch.next);
      }
      for (const p of batch.progress) progress.set(p.step_key, p);
      showProgress();
      if (batch.events > 0) refresh();
    };
    source.addEventListener("end", () => {
      source.close();
      events.dataset.live = "false";
      progress.clear();
      refresh();
    });
    // The browser would reconnect from where the page began; reconnect from where it is.
    source.onerror = () => {
      source.close();
      if (events.dataset.live === "true") setTimeout(connect, 2000);
    };
  }

  if (events.dataset.live === "true") connect();
}

function followApprovals(part) {
  let shown = part.innerHTML;
  async function poll() {
    try {
      if (!editing(part)) {
        const response = await fetch(part.dataset.src, { credentials: "same-origin" });
        const html = response.ok ? await response.text() : shown;
        if (html !== shown && !editing(part)) {
          part.innerHTML = html;
          shown = html;
          formatTimes(part);
        }
      }
    } finally {
      setTimeout(poll, 2000);
    }
  }
  setTimeout(poll, 2000);
}

// A JSON block's Copy button: shown only where the script runs, and copies the block's text.
document.addEventListener("click", (event) => {
  const button = event.target.closest && event.target.closest("button.copy");
  if (!button) return;
  const pre = button.parentElement.querySelector("pre");
  if (!pre || !navigator.clipboard) return;
  navigator.clipboard.writeText(pre.textContent).then(() => {
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = "Copy"; }, 1500);
  });
});

function showCopyButtons(root) {
  for (const button of (root || document).querySelectorAll("button.copy[hidden]")) button.hidden = false;
}

const observer = new MutationObserver(() => showCopyButtons(document));

document.addEventListener("DOMContentLoaded", () => {
  formatTimes(document);
  showCopyButtons(document);
  observer.observe(document.body, { childList: true, subtree: true });
  const events = document.querySelector("table#events[data-run]");
  if (events) followRun(events);
  const approvals = document.getElementById("approvals-live");
  if (approvals) followApprovals(approvals);
});
