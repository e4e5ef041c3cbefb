// Keeps a tree page current: the tree's events (server-sent, from /events/tree/ID) say that
// something changed; the page then fetches itself again and puts in the new rows (this
// console's own escaped HTML). Reloads are spaced by at least RELOAD_MS.
"use strict";
(function () {
  const live = document.getElementById("tree-live");
  const status = document.getElementById("live-status");
  if (!live || !window.EventSource || !window.fetch) return;
  const RELOAD_MS = 1000;
  const RETRY_MS = 3000;
  let pending = null;

  async function reload() {
    pending = null;
    const response = await fetch(window.location.pathname, { credentials: "same-origin" });
    if (!response.ok) {
      status.textContent = "the tree could not be reloaded (" + response.status + ")";
      return;
    }
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = page.getElementById("tree-live");
    if (fresh) live.replaceChildren(...fresh.childNodes);
  }

  function follow() {
    const source = new EventSource(
      "/events/tree/" + encodeURIComponent(live.dataset.root)
    );
    source.onopen = () => { status.textContent = "following the tree"; };
    source.onmessage = (message) => {
      const item = JSON.parse(message.data);
      // A damaged child the listing could not place has no seq: its line names it without one.
      const at = item.seq === null || item.seq === undefined ? "" : " #" + item.seq;
      status.textContent = "following the tree; last: " + item.session_id + at + " " + item.type;
      if (pending === null) pending = setTimeout(reload, RELOAD_MS);
    };
    source.onerror = () => {
      source.close();
      status.textContent = "the live feed is interrupted (the console or its store is gone); retrying";
      setTimeout(() => { follow(); reload(); }, RETRY_MS);
    };
  }
  follow();
})();
