// Ludus replay player: steps through an episode embedded in the page (no network, no library).
// Each .ludus-replay element holds its episode as <script type="application/json">; the board of
// the step shown is the text of .board (drawn as a board where it holds one), and the element's
// data-step attribute is its index.
(function () {
  "use strict";
  function describe(episode, step) {
    if (!step.actions.length) return "start";
    return step.actions.map(function (sa) {
      return "seat " + sa[0] + " (" + episode.players[sa[0]] + ") plays " + sa[1];
    }).join(", ");
  }
  // Boards drawn as boards: the longest run of at least 3 consecutive lines of one length (3 to 26
  // characters, no spaces) in a step's board text is a grid of cells, drawn as SVG; '.' is an empty
  // cell, x / X the first seat's mark and o / O the second's, in the colours of the play page.
  // The text stays in .board (under the drawing when it says more than the grid).
  var SVG = "http://www.w3.org/2000/svg", CELL = 34;
  var SEAT_COLOURS = {x: "#1f4e8c", o: "#c0392b"};
  function boardGrid(text) {
    var lines = text.replace(/\n+$/, "").split("\n"), best = null, start = 0;
    for (var i = 1; i <= lines.length; i++) {
      if (i < lines.length && lines[i].length === lines[start].length) continue;
      var run = lines.slice(start, i), width = run[0].length;
      if (run.length >= 3 && width >= 3 && width <= 26 && run.length <= 26 &&
          run.every(function (l) { return /^[^\s]+$/.test(l); }) && (!best || run.length > best.rows.length)) {
        best = {rows: run, first: start, last: i - 1, rest: lines.length - run.length};
      }
      start = i;
    }
    return best;
  }
  function el(name, attrs) {
    var node = document.createElementNS(SVG, name);
    for (var k in attrs) node.setAttribute(k, String(attrs[k]));
    return node;
  }
  function drawBoard(box, grid, discs) {
    var rows = grid.rows, cols = rows[0].length;
    var svg = el("svg", {viewBox: "0 0 " + cols * CELL + " " + rows.length * CELL, width: cols * CELL,
                         height: rows.length * CELL, role: "img", "class": "board-svg",
                         "aria-label": "the board, " + rows.length + " by " + cols});
    rows.forEach(function (row, r) {
      for (var c = 0; c < cols; c++) {
        var ch = row.charAt(c), x = c * CELL, y = r * CELL, key = ch.toLowerCase();
        svg.appendChild(el("rect", {x: x + 1, y: y + 1, width: CELL - 2, height: CELL - 2, rx: 4,
                                    fill: discs ? "#e8eef7" : "#fafafa", stroke: "#c8c8c8"}));
        if (ch === ".") continue;
        var colour = SEAT_COLOURS[key] || "#444";
        if (discs && SEAT_COLOURS[key]) {
          svg.appendChild(el("circle", {cx: x + CELL / 2, cy: y + CELL / 2, r: CELL / 2 - 5, fill: colour,
                                        "data-mark": ch}));
        } else {
          var t = el("text", {x: x + CELL / 2, y: y + CELL / 2 + 7, "text-anchor": "middle", "font-size": 20,
                              "font-weight": 700, "font-family": "DejaVu Sans Mono, monospace", fill: colour,
                              "data-mark": ch});
          t.textContent = ch;
          svg.appendChild(t);
        }
      }
    });
    box.replaceChildren(svg);
  }
  function mount(root) {
    var episode = JSON.parse(root.querySelector("script[type='application/json']").textContent);
    var steps = episode.steps, last = steps.length - 1, index = 0, timer = null;
    var board = root.querySelector(".board"), label = root.querySelector(".step-label");
    var drawing = document.createElement("div"), discs = /connect_?four/i.test(episode.game || "");
    drawing.className = "board-drawing";
    board.parentNode.insertBefore(drawing, board);
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
      var grid = boardGrid(steps[index].board);
      drawing.hidden = !grid;
      board.hidden = !!grid && grid.rest === 0;  // the text says nothing the drawing does not
      if (grid) drawBoard(drawing, grid, discs); else drawing.replaceChildren();
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
