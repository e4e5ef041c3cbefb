// Follows the session page's transcript live (server-sent events from /session/ID/events).
// Text goes in through textContent only: a log text is never parsed as HTML.
"use strict";
(function () {
  const list = document.getElementById("transcript");
  const status = document.getElementById("live-status");
  if (!list || !window.EventSource) return;
  let after = Number(list.dataset.after);
  const RETRY_MS = 3000;
  let stopped = false;

  function add(item) {
    if (item.seq < after) return; // already shown
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
  }

  function follow() {
    // Our own reconnection, not EventSource's: it would ask again from the first `after`.
    const source = new EventSource(
      "/events/session/" + encodeURIComponent(list.dataset.session) + "?after=" + after
    );
    source.onopen = () => { status.textContent = "following new events"; };
    source.onmessage = (message) => add(JSON.parse(message.data));
    source.addEventListener("problem", (message) => {
      const data = JSON.parse(message.data);
      status.textContent = "the live feed stopped: " + data.problem;
      if (data.damaged !== true) return; // asked again after RETRY_MS (the stream ends next)
      // Damaged under the feed: said in the transcript, where its events stop, and not asked
      // again (it would say the same).
      const problem = data.problem;
      source.close();
      stopped = true;
      const entry = document.createElement("li");
      entry.className = "entry diagnostic";
      entry.dataset.type = "damaged";
      const text = document.createElement("pre");
      text.textContent = problem;
      entry.append(text);
      list.insertBefore(entry, list.querySelector("li[data-type='usage']"));
    });
    source.onerror = () => {
      source.close();
      if (stopped) return;
      if (!status.textContent.startsWith("the live feed stopped")) {
        status.textContent = "the live feed is interrupted (the console or its store is gone); retrying";
      }
      setTimeout(follow, RETRY_MS);
    };
  }
  follow();
})();
