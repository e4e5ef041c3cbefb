// On every page: a banner while the console's store does not answer, from the corpus pulse
// (`event: store` of the server-sent events at /live); and on the overview and the roots pages,
// the page kept current: each generation of the pulse (at most one a second) makes the page
// fetch itself again and put in its new <main> (this console's own escaped HTML). A "Store
// unavailable" page loads itself again once the store is back. A page that follows its own feed
// (a session or subtree page) asks /live/state now and then instead of holding /live open: a
// browser holds six HTTP/1.1 connections per host, and two streams per tab stall the fourth tab.
"use strict";
(function () {
  const banner = document.getElementById("store-banner");
  const main = document.querySelector("main");
  if (!banner || !main || !window.EventSource || !window.fetch) return;
  const path = window.location.pathname;
  const live = path === "/" || path === "/tree";
  const unavailable = document.getElementById("store-unavailable") !== null;
  const fed = document.getElementById("transcript") !== null || document.getElementById("tree-live") !== null;
  const RETRY_MS = 3000;
  const POLL_MS = 3000;
  let down = false;
  let busy = false;
  let again = false;

  function show(text) {
    banner.textContent = text;
    banner.hidden = false;
  }

  function hide() {
    banner.hidden = true;
    banner.textContent = "";
  }

  async function refresh(generation) {
    if (busy) { again = true; return; }
    busy = true;
    try {
      const response = await fetch(path + window.location.search, { credentials: "same-origin" });
      if (response.ok) {
        const page = new DOMParser().parseFromString(await response.text(), "text/html");
        const fresh = page.querySelector("main");
        if (fresh) main.replaceChildren(...fresh.childNodes);
        main.dataset.generation = String(generation);
      }
    } catch (error) {
      // The console went away meanwhile: the feed's error handler says so and reconnects.
    } finally {
      busy = false;
      if (again) { again = false; refresh(generation); }
    }
  }

  function store(state) {
    document.body.dataset.store = state.up ? "up" : "down";
    if (!state.up) {
      down = true;
      show("The store does not answer (" + state.problem + "): what this page shows may be out of date. It recovers when the store is back.");
      return;
    }
    hide();
    if (!down) return;
    down = false;
    if (unavailable) window.location.reload();
    else if (live) refresh("back");
  }

  async function poll() {
    try {
      const response = await fetch("/live/state", { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) throw new Error(String(response.status));
      store(await response.json());
    } catch (error) {
      down = true;
      show("The console does not answer: retrying.");
    }
    setTimeout(poll, POLL_MS);
  }

  function follow() {
    const source = new EventSource("/live");
    source.addEventListener("store", (message) => store(JSON.parse(message.data)));
    source.onmessage = (message) => {
      if (live) refresh(JSON.parse(message.data).generation);
    };
    source.onerror = () => {
      source.close();
      down = true;
      show("The console does not answer: retrying.");
      setTimeout(follow, RETRY_MS);
    };
  }
  if (fed) poll();
  else follow();
})();
