// Ludus replay player: steps through an episode embedded in the page (no network, no library).
// Each .ludus-replay element holds its episode as <script type="application/json">; the board of
// the step shown is the text of .board, and the element's data-step attribute is its index.
(function () {
  "use strict";
  function describe(episode, step) {
    if (!step.actions.length) return "start";
    return step.actions.map(function (sa) {
      return "seat " + sa[0] + " (" + episode.players[sa[0]] + ") plays " + sa[1];
    }).join(", ");
  }
  function mount(root) {
    var episode = JSON.parse(root.querySelector("script[type='application/json']").textContent);
    var steps = episode.steps, last = steps.length - 1, index = 0, timer = null;
    var board = root.querySelector(".board"), label = root.querySelector(".step-label");
    var scrub = root.querySelector(".scrub"), play = root.querySelector(".play");
    var list = root.querySelector(".moves");
    scrub.max = String(last);
    steps.forEach(function (step, k) {
      var item = document.createElement("li");
      item.textContent = describe(episode, step);
      item.addEventListener("click", function () { stop(); show(k); });
      list.appendChild(item);
    });
    function show(k) {
      index = Math.max(0, Math.min(last, k));
      board.textContent = steps[index].board;
      scrub.value = String(index);
      root.dataset.step = String(index);
      label.textContent = "step " + index + " of " + last + ": " + describe(episode, steps[index]);
      Array.prototype.forEach.call(list.children, function (item, k) {
        item.className = k === index ? "current" : "";
      });
    }
    function stop() {
      if (timer !== null) { clearInterval(timer); timer = null; }
      play.textContent = "play";
    }
    function start() {
      if (index >= last) show(0);
      play.textContent = "pause";
      timer = setInterval(function () {
        if (index >= last) stop(); else show(index + 1);
      }, Number(root.dataset.delayMs || 700));
    }
    root.querySelector(".first").addEventListener("click", function () { stop(); show(0); });
    root.querySelector(".back").addEventListener("click", function () { stop(); show(index - 1); });
    root.querySelector(".forward").addEventListener("click", function () { stop(); show(index + 1); });
    root.querySelector(".last").addEventListener("click", function () { stop(); show(last); });
    play.addEventListener("click", function () { if (timer === null) start(); else stop(); });
    scrub.addEventListener("input", function () { stop(); show(Number(scrub.value)); });
    root.addEventListener("keydown", function (event) {
      if (event.key === "ArrowRight") { stop(); show(index + 1); }
      else if (event.key === "ArrowLeft") { stop(); show(index - 1); }
      else if (event.key === " ") { event.preventDefault(); if (timer === null) start(); else stop(); }
    });
    show(0);
  }
  Array.prototype.forEach.call(document.querySelectorAll(".ludus-replay"), mount);
})();
