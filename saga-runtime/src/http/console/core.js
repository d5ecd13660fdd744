"use strict";

// ---------------------------------------------------------------- constants

const STATUSES = ["Pending", "Running", "Compensating", "Completed", "Compensated",
  "Failed", "Cancelled", "CompensationFailed", "DeadLettered", "Resolved"];
const ATTENTION = ["CompensationFailed", "DeadLettered"];
const TERMINAL = ["Completed", "Compensated", "Failed", "Cancelled",
  "CompensationFailed", "DeadLettered", "Resolved"];
const PROGRESS_EVENTS = ["step_started", "attempt_failed", "retry_scheduled",
  "step_completed", "compensating", "step_compensated", "audit"];
/** What a status badge says (its `data-status` keeps the API's value). */
const STATUS_LABELS = {
  Pending: "pending", Running: "running", Compensating: "compensating", Completed: "completed",
  Compensated: "compensated", Failed: "failed", Cancelled: "cancelled",
  CompensationFailed: "compensation failed", DeadLettered: "dead-lettered", Resolved: "resolved by hand",
};
/** A value shown in a page is cut here; the API has all of it. */
const VALUE_CAP_BYTES = 2048;
/** Lists show this much of a task id (a prefix: the API wants the whole id). */
const SHORT_ID = 8;
const TOKEN_KEY = "saga-console.token";
const OPERATOR_KEY = "saga-console.operator";
const OVERVIEW_REFRESH_MS = 2000;
/** The attention and dead-letter lists re-read this often (their forms are kept). */
const LIST_REFRESH_MS = 5000;

const settings = { changesAllowed: true };

// ---------------------------------------------------------------- DOM helpers

/** An element: h("a", {href: "#/"}, "text", child, [more children]). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value == null || value === false) continue;
    // Handlers are listeners: the page's Content-Security-Policy refuses
    // `on...=` attributes, and `style=` ones too (use a class).
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "style") throw new Error("style attributes are refused by the CSP: use a class");
    else if (key === "class") el.className = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** `nodes` flattened, without the null and false of `cond && node`. */
function present(nodes) {
  return nodes.flat(Infinity).filter((n) => n != null && n !== false);
}

/** A table with a header row; `rows` are <tr>s, `empty` shown when none. */
function table(attrs, headers, rows, empty) {
  const head = h("tr", {}, headers.map((c) =>
    typeof c === "string" ? h("th", {}, c) : h("th", c.attrs, c.text)));
  const body = rows.length ? rows
    : [h("tr", {}, h("td", { class: "empty", colspan: headers.length }, empty || "Nothing here."))];
  return h("table", attrs, h("thead", {}, head), h("tbody", {}, body));
}

/** "CompensationRetried" as "compensation retried": no raw enum name on screen. */
function words(name) {
  return String(name).replace(/([a-z0-9])([A-Z])/g, "$1 $2").toLowerCase();
}

function statusLabel(status) {
  return STATUS_LABELS[status] || words(status);
}

function badge(status) {
  return h("span", { class: `badge s-${status}`, "data-status": status, title: status }, statusLabel(status));
}

/** A link to a task showing its short id; hovering shows the full id. */
function taskLink(id, text) {
  return h("a", { class: "mono", href: `#/task/${id}`, title: `task ${id}` }, text || shortId(id));
}

function shortId(id) {
  return String(id).slice(0, SHORT_ID);
}

/** Copies `text`; where the clipboard is refused, selects `fallback`'s text for Ctrl+C. */
async function copyText(text, fallback) {
  try {
    await navigator.clipboard.writeText(text);
    showNotice(`Copied ${text}`);
  } catch (_) {
    const range = document.createRange();
    range.selectNodeContents(fallback);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
    showNotice("Selected: press Ctrl+C (or \u2318C) to copy.");
  }
}

/** A description list of [label, value] pairs, skipping empty values. */
function facts(pairs) {
  const items = pairs.filter(([, v]) => v != null && v !== "");
  return h("dl", { class: "facts" }, items.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

function json(value) {
  return h("pre", {}, JSON.stringify(value, null, 2));
}

function fmtBytes(n) {
  if (n < 1024) return `${n} B`;
  return `${(n / 1024).toFixed(n < 10240 ? 1 : 0)} kB`;
}

/**
 * A JSON value, collapsed: a one-line preview that opens on the value,
 * pretty-printed and cut at VALUE_CAP_BYTES with a note saying where the
 * rest is (`source`, an API path).
 */
function valueBlock(value, source, attrs) {
  const pretty = JSON.stringify(value, null, 2) ?? "null";
  const bytes = new TextEncoder().encode(pretty);
  const capped = bytes.length > VALUE_CAP_BYTES;
  const shown = capped
    ? new TextDecoder().decode(bytes.slice(0, VALUE_CAP_BYTES)).replace(/\uFFFD$/, "") + "\u2026"
    : pretty;
  const compact = JSON.stringify(value) ?? "null";
  const preview = compact.length > 80 ? `${compact.slice(0, 80)}\u2026` : compact;
  return h("details", { class: "value", "data-bytes": bytes.length, ...attrs },
    h("summary", { title: "Show the value" }, preview),
    h("pre", {}, shown),
    capped && h("p", { class: "cap-note", "data-test": "cap-note" },
      `first ${fmtBytes(VALUE_CAP_BYTES)} of ${fmtBytes(bytes.length)}; full value in `,
      h("a", { href: source, target: "_blank", rel: "noopener" }, source)));
}

// ---------------------------------------------------------------- formatting

function pad(n, width = 2) {
  return String(n).padStart(width, "0");
}

function fmtTime(ms) {
  if (ms == null) return "";
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function fmtClock(ms) {
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

function fmtIn(ms) {
  if (ms == null) return "";
  const s = (ms - Date.now()) / 1000;
  return s <= 0 ? "due now" : `in ${s < 10 ? s.toFixed(1) : Math.round(s)} s`;
}

function fmtDuration(ms) {
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

/** An audit entry's `details`: JSON objects as "key: value" pairs. */
function fmtDetails(details) {
  if (!details) return "";
  try {
    const value = JSON.parse(details);
    if (value && typeof value === "object") {
      return Object.entries(value).map(([k, v]) =>
        `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`).join(" · ");
    }
  } catch (_) { /* plain text */ }
  return details;
}

// ---------------------------------------------------------------- API

/**
 * The API token lives in sessionStorage: it goes with the tab, not kept
 * on disk across browser restarts for whoever uses the machine next. The
 * operator's name (no secret) is remembered in localStorage.
 */
function storedToken() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

function authHeaders() {
  const headers = {};
  const token = storedToken();
  const operator = localStorage.getItem(OPERATOR_KEY) || "";
  if (token) headers.Authorization = `Bearer ${token}`;
  if (operator) headers["X-Operator"] = operator;
  return headers;
}

/** Fetches `path` as JSON; throws {message, code, status} on an error answer. */
async function api(path, method = "GET", body) {
  const headers = authHeaders();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw { message: `cannot reach the server (${e.message})`, code: "network", status: 0 };
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!response.ok) {
    throw {
      message: (data && data.error) || text || response.statusText,
      code: (data && data.code) || `http_${response.status}`,
      status: response.status,
    };
  }
  return data;
}

/** Whether `err` is the API refusing a read for want of its token. */
function needsToken(err) {
  return !!err && err.status === 401;
}

/**
 * Follows the server-sent events of `path`, calling `on.event(name, data)`
 * for each, `on.error(err)` if the stream cannot be opened or breaks, and
 * `on.end()` when the server closes it. Read with `fetch`, not
 * `EventSource`, which cannot send the API token (`Authorization`).
 * Returns a handle whose `close()` stops it.
 */
function followEvents(path, on) {
  const controller = new AbortController();
  const dispatch = (block) => {
    let name = "message";
    const data = [];
    for (const line of block.split("\n")) {
      const text = line.replace(/\r$/, "");
      if (text.startsWith("event:")) name = text.slice(6).trim();
      else if (text.startsWith("data:")) data.push(text.slice(5).replace(/^ /, ""));
    }
    if (data.length) on.event(name, data.join("\n"));
  };
  const read = async () => {
    const response = await fetch(path, {
      headers: { ...authHeaders(), Accept: "text/event-stream" }, signal: controller.signal,
    });
    if (!response.ok) {
      let data = null;
      try { data = await response.json(); } catch (_) { data = null; }
      throw { message: (data && data.error) || response.statusText, code: (data && data.code) || `http_${response.status}`,
        status: response.status };
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        dispatch(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  };
  read().then(() => { if (!controller.signal.aborted) on.end(); }, (err) => {
    if (controller.signal.aborted) return;
    on.error(err && err.code ? err : { message: `the event stream broke (${err && err.message})`, code: "watch", status: 0 });
  });
  return { close: () => controller.abort() };
}

function query(params) {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v != null && v !== "") qs.set(k, v);
  const s = qs.toString();
  return s ? `?${s}` : "";
}

// ---------------------------------------------------------------- banners

function showError(err) {
  const el = document.getElementById("error");
  const code = err && err.code ? err.code : "error";
  el.replaceChildren(
    h("strong", {}, code), h("span", { id: "error-message" }, (err && err.message) || String(err)),
    h("button", { class: "close", title: "Dismiss", onclick: clearError }, "\u00D7"));
  el.dataset.code = code;
  el.hidden = false;
}

function clearError() {
  const el = document.getElementById("error");
  el.hidden = true;
  delete el.dataset.code;
}

function showNotice(text) {
  const el = document.getElementById("notice");
  el.replaceChildren(h("span", {}, text),
    h("button", { class: "close", title: "Dismiss", onclick: () => { el.hidden = true; } }, "\u00D7"));
  el.hidden = false;
}

// ---------------------------------------------------------------- access

/** Keeps `token` for this tab (and `operator`, if given), shown in the header. */
function setCredentials(token, operator) {
  sessionStorage.setItem(TOKEN_KEY, token);
  document.getElementById("token").value = token;
  if (operator) {
    localStorage.setItem(OPERATOR_KEY, operator);
    document.getElementById("operator").value = operator;
  }
  updateMode();
}

/**
 * Shown in place of any page while the API refuses reads without its
 * token (401): the console shows no task, letter or instance before it
 * has the token, and says so if the one it has was refused.
 */
function askForToken(view) {
  const refused = !!storedToken();
  const token = h("input", { id: "token-prompt", type: "password", placeholder: "API token", autocomplete: "off" });
  const operator = h("input", { id: "operator-prompt", placeholder: "operator name", autocomplete: "off",
    value: localStorage.getItem(OPERATOR_KEY) || "" });
  const message = h("p", { class: "dialog-error", id: "token-message", role: "alert", hidden: !refused },
    "The API refused this token: enter it again.");
  const onsubmit = (event) => {
    event.preventDefault();
    const value = token.value.trim();
    if (!value) {
      message.textContent = "Enter the API token.";
      message.hidden = false;
      token.focus();
      return;
    }
    setCredentials(value, operator.value.trim());
    route();
  };
  view.mount(h("form", { id: "token-form", class: "sign-in", onsubmit },
    h("h1", {}, "The API token, please"),
    h("p", {}, "This API shows its tasks (their input, outputs, errors and audit log) only to holders of its token. ",
      "It is kept in this tab only, and sent with every request."),
    message,
    h("label", {}, "Token", token),
    h("label", {}, "Your name (recorded in the audit log)", operator),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "primary", "data-test": "open" }, "Show the console"))));
  token.focus();
}

function loadAuthInputs() {
  // Earlier versions kept the token in localStorage: move it to this tab's
  // sessionStorage and off the disk.
  const old = localStorage.getItem(TOKEN_KEY);
  if (old != null) {
    if (old && !storedToken()) sessionStorage.setItem(TOKEN_KEY, old);
    localStorage.removeItem(TOKEN_KEY);
  }
  const token = document.getElementById("token");
  const operator = document.getElementById("operator");
  token.value = storedToken();
  operator.value = localStorage.getItem(OPERATOR_KEY) || "";
  token.addEventListener("input", () => { sessionStorage.setItem(TOKEN_KEY, token.value.trim()); updateMode(); });
  operator.addEventListener("input", () => localStorage.setItem(OPERATOR_KEY, operator.value.trim()));
  // Said before the first answer: a page that asks for the token has no other.
  updateMode();
}

function setChangesAllowed(allowed) {
  settings.changesAllowed = allowed;
  updateMode();
}

/** The header badge, and every action button enabled only if changes are allowed. */
function updateMode() {
  const mode = document.getElementById("mode");
  const hasToken = !!storedToken();
  if (!settings.changesAllowed) {
    mode.textContent = "read-only";
    mode.className = "badge ro";
    mode.title = "The server allows no changes (no Api::token or Api::authorize)";
  } else {
    mode.textContent = hasToken ? "token set" : "no token";
    mode.className = `badge ${hasToken ? "rw" : "none"}`;
    mode.title = hasToken ? "Actions send your token" : "Enter the API token to act";
  }
  document.getElementById("token").disabled = !settings.changesAllowed;
  document.getElementById("operator").disabled = !settings.changesAllowed;
  for (const button of document.querySelectorAll("button.action")) button.disabled = !settings.changesAllowed;
}

/** A button for a change; disabled while the API is read-only. */
function actionButton(label, test, onclick, kind) {
  return h("button", {
    class: `action ${kind || ""}`, "data-test": test, disabled: !settings.changesAllowed, onclick,
  }, label);
}

// ---------------------------------------------------------------- confirmations

let pendingAction = null;

/**
 * Asks for confirmation (and a note, if `needsNote`; one may be given if
 * `mayNote`) in the page's dialog, then runs `run(note)`, reports its
 * `done` text and calls `after`.
 */
function confirmAction({ title, id, verb, needsNote, mayNote, run, done, after }) {
  pendingAction = { needsNote, run, done, after };
  document.getElementById("action-title").textContent = title;
  document.getElementById("action-id").textContent = id || "";
  dialogMessage("");
  const label = document.getElementById("note-label");
  label.hidden = !needsNote && !mayNote;
  label.firstChild.textContent = needsNote ? "Note (what you found and did; recorded in the audit log)"
    : "Note (optional: why; recorded in the audit log)";
  const note = document.getElementById("note");
  note.value = "";
  document.getElementById("confirm").textContent = verb;
  document.getElementById("modal").hidden = false;
  (needsNote || mayNote ? note : document.getElementById("confirm")).focus();
}

function closeModal() {
  pendingAction = null;
  dialogMessage("");
  document.getElementById("modal").hidden = true;
}

/** A message inside the dialog (a banner would be behind its overlay); "" hides it. */
function dialogMessage(text) {
  const el = document.getElementById("action-message");
  el.textContent = text;
  el.hidden = !text;
}

async function submitAction(event) {
  event.preventDefault();
  const action = pendingAction;
  if (!action) return;
  const note = document.getElementById("note").value.trim();
  if (action.needsNote && !note) {
    dialogMessage("Write a note: it is what the next operator reads.");
    document.getElementById("note").focus();
    return;
  }
  closeModal();
  await act(() => action.run(note), action.done, action.after);
}

/** Runs a change; shows its error or `done`, then calls `after`. */
async function act(run, done, after) {
  clearError();
  try {
    const result = await run();
    showNotice(typeof done === "function" ? done(result) : done);
  } catch (err) {
    showError(err);
  }
  if (after) {
    try { await after(); } catch (err) { showError(err); }
  }
}

function resolveTask(id, after) {
  confirmAction({
    title: `Resolve task ${shortId(id)}: you fixed what it left behind by hand`, id: `task ${id}`,
    verb: "Resolve", needsNote: true, after,
    run: (note) => api(`/api/tasks/${id}/resolve`, "POST", { note }),
    done: `Task ${id} resolved.`,
  });
}

function retryCompensation(id, after) {
  confirmAction({
    title: `Retry the failed compensation of task ${shortId(id)}`, id: `task ${id}`,
    verb: "Retry compensation", needsNote: true, after,
    run: (note) => api(`/api/tasks/${id}/retry-compensation`, "POST", { note }),
    done: `Compensation of task ${id} runs again.`,
  });
}

/**
 * What a cancellation answered, in words: a machine code (`{"result":
 * "AlreadyCancelled"}`, `{"status": "Cancelled"}`) or older prose
 * (`{"status": "Already cancelled"}`).
 */
function cancelOutcome(answer) {
  const value = answer && (answer.result ?? answer.outcome ?? answer.status ?? answer.code);
  return value ? words(value) : "cancellation requested";
}

function cancelTask(id, after) {
  confirmAction({
    title: `Cancel task ${shortId(id)}? Its completed steps are compensated.`, id: `task ${id}`,
    verb: "Cancel task", mayNote: true, after,
    // Who asks (X-Operator) and why go in the audit log; a server that
    // takes no body ignores it.
    run: (note) => api(`/api/tasks/${id}/cancel`, "POST", note ? { note } : {}),
    done: (r) => `Task ${id}: ${cancelOutcome(r)}.`,
  });
}

function requeueLetter(id, after) {
  act(() => api(`/api/dead-letters/${encodeURIComponent(id)}/requeue`, "POST"),
    `Dead letter ${id} requeued.`, after);
}

function discardLetter(id, after) {
  confirmAction({
    title: `Discard dead letter ${id}`,
    verb: "Discard", needsNote: true, after,
    run: (note) => api(`/api/dead-letters/${encodeURIComponent(id)}/discard`, "POST", { note }),
    done: `Dead letter ${id} discarded.`,
  });
}

/** The buttons of what may be done to a task in `status`. */
function taskActions(id, status, after) {
  const buttons = [];
  if (ATTENTION.includes(status)) {
    buttons.push(actionButton("Resolve", "resolve", () => resolveTask(id, after), "primary"));
  }
  if (status === "CompensationFailed") {
    buttons.push(actionButton("Retry compensation", "retry-compensation", () => retryCompensation(id, after)));
  }
  if (status === "Pending" || status === "Running") {
    buttons.push(actionButton("Cancel", "cancel", () => cancelTask(id, after), "danger"));
  }
  return h("div", { class: "actions" }, buttons);
}

// ---------------------------------------------------------------- routing

/** The view being shown: knows whether it is still current, and cleans up after itself. */
class View {
  constructor(root) {
    this.root = root;
    this.alive = true;
    this.cleanups = [];
  }
  /** Shows `nodes` (arrays flattened; null and false, from `cond && node`, skipped). */
  mount(...nodes) {
    if (this.alive) this.root.replaceChildren(...present(nodes));
  }
  onLeave(fn) {
    this.cleanups.push(fn);
  }
  /** Calls `fn` every `ms` after the previous call ended, while the view is shown. */
  every(ms, fn) {
    let timer;
    const tick = async () => {
      try {
        await fn();
      } catch (err) {
        // The token went (or changed): ask for it rather than show stale data.
        if (needsToken(err) && this.alive) { route(); return; }
        showError(err);
      }
      if (this.alive) timer = setTimeout(tick, ms);
    };
    timer = setTimeout(tick, ms);
    this.onLeave(() => clearTimeout(timer));
  }
  leave() {
    this.alive = false;
    for (const fn of this.cleanups) fn();
  }
}

const ROUTES = [
  [/^\/$/, overviewView],
  [/^\/tasks$/, tasksView],
  [/^\/task\/([^/]+)$/, taskView],
  [/^\/attention$/, attentionView],
  [/^\/dead-letters$/, deadLettersView],
  [/^\/processes$/, processesView],
  [/^\/process\/([^/]+)$/, processView],
  [/^\/process\/([^/]+)\/([^/]+)$/, instanceView],
];

let current = null;

async function route() {
  if (current) current.leave();
  closeModal();
  clearError();
  document.getElementById("notice").hidden = true;
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, qs] = hash.split("?");
  const params = new URLSearchParams(qs || "");
  for (const link of document.querySelectorAll("#nav a")) {
    const prefix = link.dataset.nav;
    link.classList.toggle("active", prefix === "/" ? path === "/" : path.startsWith(prefix));
  }
  const view = current = new View(document.getElementById("view"));
  view.mount(h("p", { class: "muted" }, "Loading\u2026"));
  for (const [pattern, render] of ROUTES) {
    const match = path.match(pattern);
    if (!match) continue;
    const args = match.slice(1).map(decodeURIComponent);
    try {
      await render(view, params, ...args);
    } catch (err) {
      if (!view.alive) return;
      if (needsToken(err)) {
        askForToken(view);
        return;
      }
      showError(err);
      view.mount(h("h1", {}, "Could not load this page"), h("p", {}, h("a", { href: "#/" }, "Back to the overview")));
    }
    return;
  }
  view.mount(h("h1", {}, "No such page"), h("p", {}, h("a", { href: "#/" }, "Back to the overview")));
}

function pager(params, next, hashPath) {
  const links = [];
  if (params.get("cursor")) {
    const first = new URLSearchParams(params);
    first.delete("cursor");
    links.push(h("a", { href: `#${hashPath}${query(Object.fromEntries(first))}`, "data-test": "first-page" }, "\u2190 First page"));
  }
  if (next) {
    const more = new URLSearchParams(params);
    more.set("cursor", next);
    links.push(h("a", { href: `#${hashPath}${query(Object.fromEntries(more))}`, "data-test": "next-page" }, "Next page \u2192"));
  }
  return h("div", { class: "pager" }, links);
}

