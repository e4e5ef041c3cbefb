// Follows the session page's transcript live (server-sent events from /session/ID/events).
// Text goes in through textContent only: a log text is never parsed as HTML.
"use strict";
(function () {
  const list = document.getElementById("transcript");
  const status = document.getElementById("live-status");
  if (!list || !window.EventSource) return;
  let after = Number(list.dataset.after);
  const url = () => "/session/" + encodeURIComponent(list.dataset.session) + "/events?after=" + after;
  const source = new EventSource(url());
  source.onopen = () => { status.textContent = "following new events"; };
  source.onerror = () => { status.textContent = "the live feed is interrupted; retrying"; };
  source.onmessage = (message) => {
    const item = JSON.parse(message.data);
    const entry = document.createElement("li");
    entry.className = "entry live";
    entry.dataset.type = item.type;
    const seq = document.createElement("span");
    seq.className = "seq";
    seq.textContent = String(item.seq);
    const text = document.createElement("pre");
    text.textContent = item.lines.join("\n");
    entry.append(seq, " ", text);
    // Before the session's usage total, which stays the last entry.
    list.insertBefore(entry, list.querySelector("li[data-type='usage']"));
    after = Math.max(after, item.seq + 1);
  };
})();
