/* mappa report: tabs and the episode viewer.
 *
 * Every piece of run data reaches the page through textContent or a text node (the helper
 * `el` below), never parsed as markup: agents write arbitrary text, HTML and <script> included,
 * and the report must show it, not run it. Each step's episodes live in steps/*.js, loaded
 * on demand by a <script src> (fetch() is refused on file:// pages), which calls
 * mappaStep(run, step, episodes).
 */
"use strict";

const DATA = JSON.parse(document.getElementById("mappa-data").textContent);
const loaded = {}; // "run:step" -> episodes
const pending = {}; // "run:step" -> [callbacks]

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return node;
}

/* ---------- tabs ---------- */
function showView(name) {
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.view === name);
  for (const s of document.querySelectorAll("section.view")) s.classList.toggle("active", s.id === "view-" + name);
  if (name === "episodes") ensureViewer();
  if (location.hash !== "#" + name) history.replaceState(null, "", "#" + name);
}
for (const b of document.querySelectorAll("nav button")) b.addEventListener("click", () => showView(b.dataset.view));

/* ---------- step files ---------- */
window.mappaStep = function (run, step, episodes) {
  const key = run + ":" + step;
  loaded[key] = episodes;
};

function loadStep(run, step, done) {
  const key = run + ":" + step;
  if (loaded[key]) return done(loaded[key]);
  if (pending[key]) return pending[key].push(done);
  pending[key] = [done];
  const info = DATA.runs[run].steps.find((s) => s.step === step);
  const script = el("script", { src: info.file });
  const finish = () => {
    const callbacks = pending[key];
    delete pending[key];
    for (const cb of callbacks) cb(loaded[key] || null);
  };
  script.addEventListener("load", finish);
  script.addEventListener("error", finish);
  document.head.appendChild(script);
}

/* ---------- text rendering ---------- */
const PY_KEYWORDS = new Set(("and as assert async await break class continue def del elif else except False finally " +
  "for from global if import in is lambda None nonlocal not or pass raise return True try while with yield print").split(" "));
const PY_TOKEN = /(#[^\n]*)|("""[\s\S]*?(?:"""|$)|'''[\s\S]*?(?:'''|$)|"(?:\\.|[^"\\\n])*"?|'(?:\\.|[^'\\\n])*'?)|(\b\d[\d_]*(?:\.\d*)?(?:e[+-]?\d+)?\b)|([A-Za-z_]\w*)(\s*\()?|([\s\S])/g;

function highlightPython(code) {
  const pre = el("pre", { class: "code" });
  let plain = "";
  const flush = () => { if (plain) { pre.appendChild(document.createTextNode(plain)); plain = ""; } };
  const span = (cls, text) => { flush(); pre.appendChild(el("span", { class: cls }, text)); };
  for (const m of code.matchAll(PY_TOKEN)) {
    if (m[1] !== undefined) span("com", m[1]);
    else if (m[2] !== undefined) span("str", m[2]);
    else if (m[3] !== undefined) span("num", m[3]);
    else if (m[4] !== undefined) {
      if (PY_KEYWORDS.has(m[4])) span("kw", m[4]);
      else if (m[5] !== undefined) span("fn", m[4]);
      else plain += m[4];
      if (m[5] !== undefined) plain += m[5];
    } else plain += m[6];
  }
  flush();
  return pre;
}

/* The agent's output: prose as text, fenced code blocks highlighted (an unclosed fence, as
 * a truncated action leaves, runs to the end). */
function renderOutput(text) {
  const box = el("div");
  const fence = /```([\w+-]*)[^\n]*\n([\s\S]*?)(?:```|$)/g;
  let last = 0;
  for (const m of text.matchAll(fence)) {
    if (m.index > last) box.appendChild(el("div", { class: "prose" }, text.slice(last, m.index)));
    box.appendChild(highlightPython(m[2]));
    last = m.index + m[0].length;
  }
  if (last < text.length) box.appendChild(el("div", { class: "prose" }, text.slice(last)));
  return box;
}

function fmtScore(s) {
  return s === null || s === undefined || s.v === null ? "-" : Number(s.v).toFixed(1);
}

function outcomeBadge(correct) {
  if (correct === true) return el("span", { class: "badge good" }, "right");
  if (correct === false) return el("span", { class: "badge bad" }, "wrong");
  return el("span", { class: "badge" }, "not graded");
}

function lazyDetails(label, build) {
  const d = el("details", {}, el("summary", { class: "label" }, label));
  d.addEventListener("toggle", () => { if (d.open && d.childNodes.length === 1) d.appendChild(build()); });
  return d;
}

function renderAction(a) {
  const s = a.score;
  const head = el("div", { class: "head" },
    el("span", {}, a.agent + " #" + a.turn),
    el("span", { class: "badge score" }, "coach " + fmtScore(s)),
    s && s.flag ? el("span", { class: "badge flag" }, "flagged" + (s.reason ? ": " + s.reason : "")) : null,
    s && s.cached ? el("span", { class: "badge" }, "cached") : null,
    s && s.ac !== null && s.ac !== undefined ? el("span", { class: "badge" }, "coach says answer " + (s.ac ? "right" : "wrong")) : null,
    el("span", { class: "badge" }, a.ntok + " tokens"),
    a.trunc ? el("span", { class: "badge bad" }, "truncated") : null,
    a.status ? el("span", { class: "badge " + (a.status === "ok" ? "good" : "bad") }, "code: " + a.status) : null);
  const box = el("div", { class: "action", "data-agent": a.agent }, head,
    lazyDetails("input the agent saw", () => el("pre", {}, a.prompt)),
    el("div", { class: "label" }, "output"), renderOutput(a.out));
  if (a.tool !== null && a.tool !== undefined) box.append(el("div", { class: "label" }, "tool output"), el("pre", {}, a.tool));
  if (a.files) box.append(el("div", { class: "label" }, "workspace files"), el("pre", {}, a.files));
  if (s) box.append(el("div", { class: "label" }, "coach rationale"), el("pre", { class: "rationale" }, s.why || "(none)"));
  return box;
}

function renderOutcome(ep) {
  const box = el("div", { class: "outcome" }, el("div", { class: "label" }, "outcome"));
  const line = el("div", {}, outcomeBadge(ep.correct), " final answer: ", el("code", {}, ep.final === null || ep.final === undefined ? "(none)" : String(ep.final)));
  if (ep.answer !== null && ep.answer !== undefined) line.append("  expected: ", el("code", {}, String(ep.answer)));
  box.appendChild(line);
  const metrics = Object.entries(ep.metrics || {});
  if (metrics.length) box.appendChild(el("div", {}, metrics.map(([k, v]) => k + " = " + (typeof v === "number" ? v.toFixed(4) : v)).join(", ")));
  const missing = Object.entries(ep.missing || {});
  if (missing.length) box.appendChild(el("div", {}, "files owed but missing: " + missing.map(([k, v]) => k + ": " + v.join(", ")).join("; ")));
  if (ep.ref) box.appendChild(lazyDetails("what the coach was told about the outcome", () => el("pre", {}, ep.ref)));
  return box;
}

function agentScores(ep, agent) {
  const chips = [];
  for (const a of ep.acts) {
    if (agent && a.agent !== agent) continue;
    chips.push(el("span", { class: "badge score", title: a.agent + " #" + a.turn }, a.agent.split("_").map((w) => w[0]).join("") + a.turn + " " + fmtScore(a.score)));
  }
  return chips;
}

/* One episode, folded to a summary line until opened; `compare` is false inside the
 * comparison itself. */
function renderEpisode(run, step, ep, agent, open, compare = true) {
  const summary = el("summary", {}, el("strong", {}, ep.task_id), el("span", { class: "muted" }, ep.type),
    outcomeBadge(ep.correct), ...agentScores(ep, agent),
    compare && el("button", { class: "link", onclick: (e) => { e.preventDefault(); compareTask(run, ep.task_id); } }, "compare across steps"));
  const d = el("details", { class: "episode", "data-episode": ep.id }, summary);
  const build = () => {
    const body = el("div", { class: "ep-body" }, el("div", { class: "label" }, "task"), el("pre", {}, ep.task));
    for (const a of ep.acts) if (!agent || a.agent === agent) body.appendChild(renderAction(a));
    body.appendChild(renderOutcome(ep));
    return body;
  };
  d.addEventListener("toggle", () => { if (d.open && d.childNodes.length === 1) d.appendChild(build()); });
  if (open) d.open = true;
  return d;
}

/* ---------- viewer ---------- */
const $ = (id) => document.getElementById(id);
let viewerReady = false;

function filters() {
  const num = (id, dflt) => { const v = parseFloat($(id).value); return Number.isFinite(v) ? v : dflt; };
  return {
    run: Number($("f-run").value), step: Number($("f-step").value), agent: $("f-agent").value,
    min: num("f-min", 0), max: num("f-max", 10), outcome: $("f-outcome").value, flagged: $("f-flagged").value,
    text: $("f-text").value.trim().toLowerCase(),
  };
}

function keep(ep, f) {
  if (f.outcome === "right" && ep.correct !== true) return false;
  if (f.outcome === "wrong" && ep.correct !== false) return false;
  if (f.outcome === "ungraded" && ep.correct !== null && ep.correct !== undefined) return false;
  const acts = ep.acts.filter((a) => !f.agent || a.agent === f.agent);
  if (f.agent && !acts.length) return false;
  const flagged = acts.some((a) => a.score && a.score.flag);
  if (f.flagged === "yes" && !flagged) return false;
  if (f.flagged === "no" && flagged) return false;
  if (f.min > 0 || f.max < 10) {
    const inRange = acts.some((a) => a.score && a.score.v !== null && a.score.v >= f.min && a.score.v <= f.max);
    if (!inRange) return false;
  }
  if (f.text && !(ep.task_id + "\n" + ep.task).toLowerCase().includes(f.text)) return false;
  return true;
}

function render() {
  const f = filters();
  const list = $("ep-list");
  list.replaceChildren(el("div", { class: "muted" }, "loading step " + f.step + " ..."));
  loadStep(f.run, f.step, (episodes) => {
    const now = filters();
    if (now.run !== f.run || now.step !== f.step) return; // a newer choice is loading
    if (!episodes) { list.replaceChildren(el("div", { class: "warning" }, "could not load this step's file (regenerate the report)")); return; }
    const shown = episodes.filter((ep) => keep(ep, now));
    $("ep-summary").textContent = "step " + now.step + ": showing " + shown.length + " of " + episodes.length + " episodes";
    list.replaceChildren(...shown.map((ep, i) => renderEpisode(now.run, now.step, ep, now.agent, i === 0)));
  });
}

function fillSteps() {
  const run = DATA.runs[Number($("f-run").value)];
  $("f-step").replaceChildren(...run.steps.map((s) => el("option", { value: s.step }, "step " + s.step + " (" + s.n + ")")));
  if (run.steps.length) $("f-step").value = run.steps[run.steps.length - 1].step;
  $("f-agent").replaceChildren(el("option", { value: "" }, "all agents"), ...run.agents.map((a) => el("option", { value: a }, a)));
}

function stepBy(delta) {
  const sel = $("f-step");
  const i = sel.selectedIndex + delta;
  if (i >= 0 && i < sel.options.length) { sel.selectedIndex = i; render(); }
}

function ensureViewer() {
  if (viewerReady) return;
  viewerReady = true;
  $("f-run").replaceChildren(...DATA.runs.map((r, i) => el("option", { value: i }, r.label)));
  $("f-run").closest("label").hidden = DATA.runs.length < 2;
  if (!DATA.runs.some((r) => r.steps.length)) { $("ep-summary").textContent = "no episodes recorded yet"; return; }
  $("f-run").value = DATA.runs.findIndex((r) => r.steps.length);
  fillSteps();
  $("f-run").addEventListener("change", () => { fillSteps(); $("compare-panel").hidden = true; render(); });
  for (const id of ["f-step", "f-agent", "f-outcome", "f-flagged"]) $(id).addEventListener("change", render);
  for (const id of ["f-min", "f-max", "f-text"]) $(id).addEventListener("input", render);
  $("f-prev").addEventListener("click", () => stepBy(-1));
  $("f-next").addEventListener("click", () => stepBy(1));
  render();
}

/* The same task at every step it was drawn: one column per step, so a change in an agent's
 * behaviour reads left to right. */
function compareTask(run, taskId) {
  const steps = DATA.runs[run].tasks[String(taskId)] || [];
  const panel = $("compare-panel");
  panel.hidden = false;
  const title = el("h3", {}, "task " + taskId + " across " + steps.length + " step(s) of " + DATA.runs[run].label + " ");
  title.appendChild(el("button", { class: "link", onclick: () => { panel.hidden = true; } }, "close"));
  const cols = el("div", { class: "compare" });
  panel.replaceChildren(title, cols);
  const agent = filters().agent;
  for (const step of steps) {
    const col = el("div", { class: "col" }, el("strong", {}, "step " + step));
    cols.appendChild(col);
    loadStep(run, step, (episodes) => {
      for (const ep of (episodes || []).filter((e) => e.task_id === taskId)) col.appendChild(renderEpisode(run, step, ep, agent, true, false));
    });
  }
  panel.scrollIntoView({ block: "start" });
}

const start = (location.hash || "#curves").slice(1);
showView(document.getElementById("view-" + start) ? start : "curves");
