// Ludus play page: a person plays one seat of a game against an entrant, through the play API
// (POST /api/play, GET /api/play/ID, POST /api/play/ID/move). No library, no network beyond the
// page's own server. Board games are played by clicking cells (or columns), games with listed
// moves by their buttons, text-move games by typing. The page's state is in data attributes for
// people's tools and tests: body[data-status], #game[data-game-id], #result[data-match-id].
(function () {
  "use strict";
  var config = JSON.parse(document.getElementById("play-config").textContent);
  var form = document.getElementById("start"), gameBox = document.getElementById("game");
  var statusLine = document.getElementById("status"), message = document.getElementById("message");
  var board = document.getElementById("board"), view = document.getElementById("view");
  var legalBox = document.getElementById("legal"), textForm = document.getElementById("text-move");
  var result = document.getElementById("result");
  var gameId = null, timer = null, busy = false, last = null;
  var tokenKey = "ludus-play-token", gameKey = "ludus-play-game";

  function headers() {
    var h = {"Content-Type": "application/json"};
    if (config.token) h["Authorization"] = "Bearer " + (sessionStorage.getItem(tokenKey) || "");
    return h;
  }
  function call(method, path, body) {
    return fetch(path, {method: method, headers: headers(), cache: "no-store",
                        body: body === undefined ? undefined : JSON.stringify(body)})
      .then(function (r) { return r.json().then(function (d) { return [r.status, d]; }); });
  }
  function say(text) { message.textContent = text; }

  if (config.token && form.token) {
    form.token.value = sessionStorage.getItem(tokenKey) || "";
  }
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    if (config.token) sessionStorage.setItem(tokenKey, form.token.value.trim());
    var body = {seat: Number(form.seat.value)};
    if (form.opponent && config.choose_opponent) body.opponent = form.opponent.value;
    say("starting...");
    call("POST", "/api/play", body).then(function (rd) {
      if (rd[0] !== 201) { say("refused (" + rd[0] + "): " + rd[1].error); return; }
      say("");
      gameId = rd[1].game_id;
      sessionStorage.setItem(gameKey, gameId);  // a reload of the page comes back to this game
      gameBox.dataset.gameId = gameId;
      gameBox.hidden = false;
      show(rd[1]);
    }).catch(function (e) { say("could not start: " + e); });
  });

  function send(move) {
    if (busy || !gameId) return;
    busy = true;
    call("POST", "/api/play/" + encodeURIComponent(gameId) + "/move", move).then(function (rd) {
      busy = false;
      if (rd[0] !== 200) { say("refused (" + rd[0] + "): " + rd[1].error); poll(); return; }
      say("");
      show(rd[1]);
    }).catch(function (e) { busy = false; say("the move did not arrive: " + e); });
  }
  textForm.addEventListener("submit", function (event) {
    event.preventDefault();
    var text = textForm.move.value;
    if (!text.trim()) { say("type a move first"); return; }
    textForm.move.value = "";
    send({text: text});
  });

  function poll() {
    if (!gameId) return;
    call("GET", "/api/play/" + encodeURIComponent(gameId)).then(function (rd) {
      if (rd[0] === 200) { show(rd[1]); return; }
      if (rd[0] === 404 || rd[0] === 403) {  // gone (or another account's): forget it
        sessionStorage.removeItem(gameKey);
        clearInterval(timer); timer = null; gameId = null; gameBox.hidden = true;
      }
      say("refused (" + rd[0] + "): " + rd[1].error);
    }).catch(function () {});
  }

  var saved = sessionStorage.getItem(gameKey);
  if (saved) {  // the page was reloaded during (or after) a game: show it again
    gameId = saved;
    gameBox.dataset.gameId = gameId;
    gameBox.hidden = false;
    setTimeout(poll, 0);
  }

  function drawGrid(state, mine) {
    var layout = state.layout, legal = {};
    (state.legal || []).forEach(function (m) { legal[m.action] = true; });
    board.innerHTML = "";
    for (var r = 0; r < layout.rows; r++) {
      var row = document.createElement("tr");
      for (var c = 0; c < layout.cols; c++) {
        var action = layout.click === "cell" ? r * layout.cols + c : c;
        var cell = document.createElement("td"), button = document.createElement("button");
        var mark = state.grid[r].charAt(c);
        button.type = "button";
        button.className = "cell mark-" + (mark === "." ? "empty" : mark === "x" ? "x" : mark === "o" ? "o" : "other");
        button.textContent = mark === "." ? "" : mark;
        button.dataset.action = String(action);
        button.dataset.row = String(r);
        button.dataset.col = String(c);
        button.disabled = !(mine && legal[action]);
        button.addEventListener("click", (function (a) { return function () { send({action: a}); }; })(action));
        cell.appendChild(button);
        row.appendChild(cell);
      }
      board.appendChild(row);
    }
  }

  function show(state) {
    if (last === null) {  // the form says which game this is (after a reload it would not)
      var opponent = state.players.filter(function (p, k) { return k !== state.seat; })[0];
      if (form.opponent && config.choose_opponent &&
          Array.prototype.some.call(form.opponent.options, function (o) { return o.value === opponent; })) {
        form.opponent.value = opponent;
      }
      form.seat.value = String(state.seat);
    }
    last = state;
    document.body.dataset.status = state.status;
    var mine = state.status === "your-turn";
    var seats = state.players.map(function (p, k) { return "seat " + k + ": " + p + (k === state.seat ? " (you)" : ""); });
    document.getElementById("seats").textContent = state.game + " \u00b7 " + seats.join(" \u00b7 ");
    if (state.status === "your-turn") {
      statusLine.textContent = "Your move" + (state.seconds_left !== null ?
        " (forfeit in " + Math.ceil(state.seconds_left) + " s without one)" : "") +
        (state.last ? " \u2014 the opponent played " + state.last : "");
    } else if (state.status === "waiting" || state.status === "starting") {
      statusLine.textContent = "The opponent is thinking...";
    } else if (state.status === "over") {
      statusLine.textContent = "Game over: " + state.result;
    } else {
      statusLine.textContent = "The game stopped: " + state.error;
    }
    var useGrid = state.layout && state.grid;
    board.hidden = !useGrid;
    view.hidden = !!useGrid;
    if (useGrid) {
      drawGrid(state, mine);
    } else if (view.textContent !== (state.view || "")) {
      view.textContent = state.view || "";
      view.scrollTop = view.scrollHeight;  // a text game's newest lines are at the end
    }
    legalBox.innerHTML = "";
    if (!useGrid && mine) {
      (state.legal || []).forEach(function (m) {
        var b = document.createElement("button");
        b.type = "button"; b.className = "legal"; b.textContent = m.label; b.dataset.action = String(m.action);
        b.addEventListener("click", function () { send({action: m.action}); });
        legalBox.appendChild(b);
      });
    }
    textForm.hidden = !(state.text_moves && mine);
    if (state.status === "over" || state.status === "failed") {
      clearInterval(timer); timer = null;
      result.hidden = false;
      result.innerHTML = "";
      result.append((state.status === "over" ? state.result : state.error) + ". ");
      if (state.match_id !== null && state.match_id !== undefined && config.replays) {
        result.dataset.matchId = String(state.match_id);
        var a = document.createElement("a");
        a.href = "/matches/" + state.match_id; a.id = "replay-link"; a.textContent = "replay of match " + state.match_id;
        result.append("Recorded and rated: ", a, " \u00b7 ");
        var lb = document.createElement("a");
        lb.href = "/"; lb.id = "leaderboard-link"; lb.textContent = "leaderboard";
        result.append(lb);
      }
    } else if (!timer) {
      timer = setInterval(poll, 700);
    }
  }
})();
