// The playground at /web: one episode at a time over the server's own HTTP routes (POST /reset, POST /step), so it
// plays by every rule and limit an agent meets. Everything from the server or a snippet is shown with textContent:
// a snippet that prints HTML or a script shows that text, never runs it. A line of output that reads
//   @heatmap {"title": "L0H1 pattern", "z": [[0.1, 0.9], [1.0, 0.0]]}
// is drawn as a heatmap: numbers only (at most 128 x 128), painted on a canvas; anything else stays text.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const catalogue = JSON.parse($("catalogue").textContent); // server-rendered JSON: families and their levels
  const BASE_NAMES = ["model", "torch", "nn", "F", "np", "math", "json", "reset_model"];
  const MAX_CELLS = 128;
  let episode = null;

  function setStatus(text, isError) {
    const el = $("status");
    el.textContent = text;
    el.className = "status" + (isError ? " error" : "");
  }

  function fillLevels() {
    const family = catalogue.find((f) => f.id === $("family").value);
    const level = $("level");
    level.replaceChildren();
    (family ? family.levels : []).forEach((name) => level.append(new Option(name, name)));
  }

  function onSplit() {
    const test = $("split").value === "test";
    $("seed-label").hidden = test;
    $("index-label").hidden = !test;
  }

  async function call(path, body) {
    const headers = { "Content-Type": "application/json" };
    const token = $("token") ? $("token").value.trim() : "";
    if (token) headers.Authorization = "Bearer " + token;
    let response;
    try {
      response = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
    } catch (err) {
      throw new Error("the server did not answer (" + err.message + ")");
    }
    let data = null;
    try {
      data = await response.json();
    } catch (err) {
      throw new Error("HTTP " + response.status + ": the answer was not JSON");
    }
    if (!response.ok) throw new Error("HTTP " + response.status + ": " + (data && data.detail ? data.detail : "refused"));
    return data;
  }

  function promptNames(prompt) {
    const found = new Set(BASE_NAMES);
    for (const match of (prompt || "").matchAll(/`([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)`/g)) {
      found.add(match[1]);
    }
    return [...found];
  }

  function showNames(names) {
    const box = $("names");
    box.replaceChildren();
    names.forEach((name) => {
      const chip = document.createElement("span");
      chip.className = "chip";
      chip.textContent = name;
      chip.title = "insert at the cursor";
      chip.addEventListener("click", () => insert(name));
      box.append(chip);
    });
  }

  function insert(text) {
    const area = $("code");
    const start = area.selectionStart, end = area.selectionEnd;
    area.value = area.value.slice(0, start) + text + area.value.slice(end);
    area.selectionStart = area.selectionEnd = start + text.length;
    area.focus();
  }

  async function start() {
    const body = { task_id: $("family").value, level: $("level").value, split: $("split").value };
    if (body.split === "test") {
      body.index = Number($("index").value || 0);
    } else if ($("seed").value.trim() !== "") {
      body.seed = Number($("seed").value);
    }
    setStatus("starting an episode (a new instance can take a few seconds to generate)...", false);
    $("start").disabled = true;
    try {
      const data = await call("/reset", body);
      const obs = data.observation;
      episode = { id: data.episode_id, done: false };
      $("episode-info").textContent = obs.instance_id + " · " + obs.task_id + " / " + obs.level + " · split " +
        obs.split + " · budget " + obs.max_steps + " steps";
      $("prompt").textContent = obs.prompt || "";
      $("schema").textContent = JSON.stringify(obs.answer_schema, null, 1);
      $("answer").value = JSON.stringify(obs.answer_example);
      $("log").replaceChildren();
      $("result").replaceChildren();
      showNames(promptNames(obs.prompt));
      $("episode").hidden = false;
      setButtons(true);
      setStatus("episode started: step 0 of " + obs.max_steps, false);
    } catch (err) {
      setStatus(err.message, true);
    } finally {
      $("start").disabled = false;
    }
  }

  function setButtons(on) {
    $("run").disabled = !on;
    $("submit").disabled = !on;
  }

  async function act(action, label) {
    if (!episode || episode.done) return;
    setButtons(false);
    try {
      const data = await call("/step", { episode_id: episode.id, action });
      const obs = data.observation;
      addTurn(label, obs);
      if (data.done) {
        episode.done = true;
        showResult(obs, data.reward);
        setStatus("episode over: score " + (obs.score === null ? "-" : obs.score), false);
      } else {
        setButtons(true);
        setStatus("step " + obs.step + " of " + obs.max_steps, false);
      }
    } catch (err) {
      setButtons(true);
      setStatus(err.message, true);
    }
  }

  function addTurn(label, obs) {
    const turn = document.createElement("div");
    turn.className = "turn";
    const head = document.createElement("div");
    head.className = "muted";
    head.textContent = "step " + obs.step + " · " + label;
    turn.append(head);
    if (label === "run") {
      const code = document.createElement("pre");
      code.textContent = $("code").value;
      turn.append(code);
    }
    const text = obs.stdout_or_error || "";
    const out = document.createElement("pre");
    out.className = "output" + (obs.error ? " error" : "");
    const plain = [];
    for (const line of text.split("\n")) {
      const map = line.startsWith("@heatmap ") ? heatmap(line.slice(9)) : null;
      if (map) {
        if (plain.length) turn.append(textBlock(plain.splice(0), obs.error));
        turn.append(map);
      } else {
        plain.push(line);
      }
    }
    if (plain.length && plain.join("").trim() !== "") turn.append(textBlock(plain, obs.error));
    if (obs.error) {
      const err = document.createElement("p");
      err.className = "error snippet-error";
      err.textContent = "error: " + obs.error;
      turn.append(err);
    }
    if (obs.output_truncated) {
      const note = document.createElement("p");
      note.className = "muted";
      note.textContent = "(output truncated by the server)";
      turn.append(note);
    }
    $("log").prepend(turn);
  }

  function textBlock(lines, isError) {
    const pre = document.createElement("pre");
    pre.className = "output" + (isError ? " error" : "");
    pre.textContent = lines.join("\n");
    return pre;
  }

  function heatmap(text) {
    let spec;
    try {
      // Python's json.dumps writes NaN, Infinity and -Infinity as bare words, which JSON lacks: as values only
      // (after "[", "," or a space), never inside a string such as the title, they become null
      spec = JSON.parse(text.replace(/(?<=[[,\s])-?(?:NaN|Infinity)(?=[\],\s])/g, "null"));
    } catch (err) {
      return null;
    }
    const z = spec && spec.z;
    if (!Array.isArray(z) || !z.length || z.length > MAX_CELLS || !Array.isArray(z[0])) return null;
    const width = z[0].length;
    if (!width || width > MAX_CELLS) return null;
    let lo = Infinity, hi = -Infinity;
    for (const row of z) {
      if (!Array.isArray(row) || row.length !== width) return null;
      for (const v of row) {
        if (v === null) continue;
        if (typeof v !== "number") return null;
        lo = Math.min(lo, v);
        hi = Math.max(hi, v);
      }
    }
    const figure = document.createElement("figure");
    const caption = document.createElement("figcaption");
    caption.className = "muted";
    caption.textContent = (typeof spec.title === "string" ? spec.title.slice(0, 200) + " · " : "") +
      z.length + " x " + width + ", min " + fmt(lo) + ", max " + fmt(hi);
    const scale = Math.max(2, Math.floor(320 / Math.max(z.length, width)));
    const canvas = document.createElement("canvas");
    canvas.className = "heatmap";
    canvas.width = width * scale;
    canvas.height = z.length * scale;
    const ctx = canvas.getContext("2d");
    const span = hi > lo ? hi - lo : 1;
    z.forEach((row, i) => row.forEach((v, j) => {
      if (v === null) {
        ctx.fillStyle = "#ccc";
      } else {
        const t = (v - lo) / span; // white (low) to dark blue (high)
        ctx.fillStyle = "rgb(" + Math.round(255 - 225 * t) + "," + Math.round(255 - 185 * t) + "," +
          Math.round(255 - 95 * t) + ")";
      }
      ctx.fillRect(j * scale, i * scale, scale, scale);
    }));
    figure.append(canvas, caption);
    return figure;
  }

  function fmt(v) {
    return Number.isFinite(v) ? Number(v.toPrecision(3)).toString() : "-";
  }

  function showResult(obs, reward) {
    const box = $("result");
    box.replaceChildren();
    const add = (label, value, pre) => {
      const h = document.createElement("h2");
      h.textContent = label;
      const el = document.createElement(pre ? "pre" : "p");
      el.textContent = value;
      box.append(h, el);
      return el;
    };
    add("Score", String(obs.score === null ? reward : obs.score), false).id = "score";
    if (obs.feedback) add("Feedback", obs.feedback, true);
    if (obs.truth !== null && obs.truth !== undefined) add("Truth", JSON.stringify(obs.truth, null, 1), true);
    if (obs.split === "test") add("Truth", "never shown on the test split", false);
  }

  function submit() {
    let answer;
    try {
      answer = JSON.parse($("answer").value);
    } catch (err) {
      setStatus("the answer is not valid JSON: " + err.message, true);
      return;
    }
    act({ solution_target: answer }, "submit");
  }

  $("family").addEventListener("change", fillLevels);
  $("split").addEventListener("change", onSplit);
  $("start").addEventListener("click", start);
  $("run").addEventListener("click", () => act({ python_code: $("code").value }, "run"));
  $("submit").addEventListener("click", submit);
  $("code").addEventListener("keydown", (e) => {
    if (e.key === "Tab") { e.preventDefault(); insert("    "); }
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); $("run").click(); }
  });
  fillLevels();
  onSplit();
  setButtons(false);
  showNames(BASE_NAMES);
})();
