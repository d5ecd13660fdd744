// ---------------------------------------------------------------- overview

async function overviewView(view) {
  const render = async () => {
    const overview = await api("/api/overview");
    setChangesAllowed(overview.changes_allowed);
    view.mount(
      h("h1", {}, "Overview", h("span", { class: "stamp", id: "updated" }, `updated ${fmtClock(Date.now())}`)),
      overviewCards(overview),
      h("h2", {}, "Tasks by saga and status"),
      countsTable(overview.sagas),
      h("h2", {}, "Process managers"),
      overview.processes.length
        ? h("ul", { id: "process-list" }, overview.processes.map(processName).map((name) =>
          h("li", {}, h("a", { href: `#/process/${encodeURIComponent(name)}` }, name))))
        : h("p", { class: "muted" }, "None registered."));
  };
  await render();
  view.every(OVERVIEW_REFRESH_MS, render);
}

function overviewCards(overview) {
  const sum = (statuses) => overview.sagas.reduce((n, s) =>
    n + statuses.reduce((m, st) => m + (s.counts[st] || 0), 0), 0);
  const card = (label, n, href, attn, test) => h("a", { href, class: "card-link" },
    h("div", { class: `card${attn && n ? " attn" : ""}`, "data-test": test },
      h("div", { class: "n" }, n), h("div", { class: "label" }, label)));
  const letters = `${overview.dead_letters}${overview.dead_letters_more ? "+" : ""}`;
  return h("div", { class: "cards" },
    card("tasks", sum(STATUSES), "#/tasks", false, "total"),
    card("in flight", sum(["Pending", "Running", "Compensating"]), "#/tasks", false, "in-flight"),
    card("compensation failed", sum(["CompensationFailed"]), "#/attention", true, "compensation-failed"),
    card("dead letters", letters, "#/dead-letters", overview.dead_letters > 0, "dead-letters"),
    card("process managers", overview.processes.length, "#/processes", false, "processes"));
}

function countsTable(sagas) {
  const headers = ["Saga", ...STATUSES.map((s) => ({ text: statusLabel(s), attrs: { class: "num", title: s } })), { text: "Total", attrs: { class: "num" } }];
  const rows = sagas.map((s) => {
    const cells = STATUSES.map((status) => {
      const n = s.counts[status] || 0;
      const attn = n > 0 && ATTENTION.includes(status);
      const cls = `num${n ? "" : " zero"}${attn ? " attn" : ""}`;
      const href = `#/tasks${query({ saga: s.saga, status })}`;
      return h("td", { class: cls, "data-status": status, "data-count": n }, n ? h("a", { href }, n) : "0");
    });
    const total = STATUSES.reduce((n, st) => n + (s.counts[st] || 0), 0);
    return h("tr", { "data-saga": s.saga },
      h("td", {}, h("a", { href: `#/tasks${query({ saga: s.saga })}` }, s.saga)),
      cells, h("td", { class: "num", "data-status": "total" }, total));
  });
  return table({ id: "overview-table" }, headers, rows, "No saga registered.");
}

// ---------------------------------------------------------------- task list

async function tasksView(view, params) {
  const filters = Object.fromEntries(["saga", "status", "step", "error"].map((k) => [k, params.get(k) || ""]));
  const [sagas, page] = await Promise.all([
    api("/api/sagas"),
    api(`/api/tasks${query({ ...filters, cursor: params.get("cursor"), limit: 50 })}`),
  ]);
  view.mount(
    h("h1", {}, "Tasks"),
    taskFilterForm(filters, sagas.sagas.map((s) => s.name)),
    table({ id: "task-list" }, [{ text: "Task", attrs: { title: ID_PREFIX_NOTE } }, "Saga", "Status", "Step", "Error", "Created", "Finished"],
      page.tasks.map(taskRow), "No task matches."),
    pager(params, page.next, "/tasks"));
}

function taskFilterForm(filters, sagaNames) {
  const select = (name, options, label = (o) => o) => h("select", { name },
    h("option", { value: "" }, "any"),
    options.map((o) => h("option", { value: o, selected: o === filters[name] }, label(o))));
  const input = (name, placeholder) => h("input", { name, value: filters[name], placeholder });
  const onsubmit = (event) => {
    event.preventDefault();
    const data = Object.fromEntries(new FormData(event.target));
    const hash = `#/tasks${query(data)}`;
    if (location.hash === hash) route();
    else location.hash = hash;
  };
  return h("form", { class: "filters", id: "task-filters", onsubmit },
    h("label", {}, "Saga", select("saga", sagaNames)),
    h("label", {}, "Status", select("status", STATUSES, statusLabel)),
    h("label", {}, "Step", input("step", "stopped at step")),
    h("label", {}, "Error contains", input("error", "text in an error")),
    h("button", { type: "submit", class: "primary" }, "Filter"),
    h("a", { href: "#/tasks" }, "Clear"));
}

function taskRow(task) {
  return h("tr", { "data-task-id": task.id },
    h("td", {}, taskLink(task.id)),
    h("td", {}, task.saga),
    h("td", {}, badge(task.status)),
    h("td", {}, task.step || ""),
    h("td", { class: "err" }, task.error || ""),
    h("td", {}, fmtTime(task.created_at)),
    h("td", {}, fmtTime(task.finished_at)));
}

// ---------------------------------------------------------------- one task

const ID_PREFIX_NOTE = `Lists show the first ${SHORT_ID} characters of a task's id, a prefix of it; ` +
  "hover one for the full id, which the API and sagactl take.";

async function taskView(view, _params, id) {
  const body = h("div", { id: "task" });
  const live = h("span", { id: "live", class: "live off" }, "");
  const fullId = h("span", { class: "mono", id: "task-id", title: "The task's full id" }, id);
  view.mount(
    h("h1", {}, `Task ${shortId(id)}`, live),
    h("div", { class: "id-line" },
      h("span", { class: "muted" }, "id"), fullId,
      h("button", { type: "button", "data-test": "copy-id", title: "Copy the full id",
        onclick: () => copyText(id, fullId) }, "Copy"),
      h("span", { class: "muted", id: "id-note" },
        `(lists show its first ${SHORT_ID} characters, ${shortId(id)}, a prefix of it; the API and sagactl take the full id)`)),
    body);
  let source = null;
  let busy = false;
  let again = false;

  const setLive = (state, text) => {
    live.className = `live ${state}`;
    live.textContent = text;
  };
  const stopWatching = () => {
    if (source) source.close();
    source = null;
  };
  const reread = () => refresh().catch(showError);
  const watch = () => {
    if (source) return;
    setLive("on", "live");
    const stream = source = followEvents(`/api/tasks/${id}/events`, {
      event: (name, data) => {
        if (PROGRESS_EVENTS.includes(name)) reread();
        else if (name === "finished") { stopWatching(); reread(); }
        else if (name === "watch_error") {
          stopWatching();
          setLive("off", "not live");
          showError({ code: "watch", message: JSON.parse(data).error });
        }
      },
      error: (err) => {
        if (source !== stream) return;
        stopWatching();
        setLive("off", "not live");
        showError(err);
      },
      // Closed before the task finished (a restart in between): read the
      // task again after a pause, which follows it anew if it still runs.
      end: () => {
        if (source !== stream) return;
        source = null;
        setLive("off", "reconnecting");
        setTimeout(() => { if (view.alive) reread(); }, 3000);
      },
    });
  };
  // Re-reads the task; events arriving meanwhile cause one more read.
  async function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    try {
      do {
        again = false;
        const task = await api(`/api/tasks/${id}`);
        if (!view.alive) return;
        body.replaceChildren(...present(renderTask(task, refresh)));
        if (ATTENTION.includes(task.status)) {
          // Stopped, not finished: it waits for an operator.
          stopWatching();
          setLive("attn", "needs an operator");
        } else if (TERMINAL.includes(task.status)) {
          stopWatching();
          setLive("off", "finished");
        } else {
          watch();
        }
      } while (again);
    } finally {
      busy = false;
    }
  }
  view.onLeave(stopWatching);
  await refresh();
}

function renderTask(task, refresh) {
  const took = task.finished_at ? ` (${fmtDuration(task.finished_at - task.created_at)})` : "";
  const source = `/api/tasks/${task.id}`;
  return [
    Object.assign(taskActions(task.id, task.status, refresh), { id: "task-actions" }),
    h("h2", {}, "Summary"),
    facts([
      ["Saga", `${task.saga} (version ${task.saga_version})`],
      ["Status", badge(task.status)],
      ["Created", fmtTime(task.created_at)],
      ["Finished", task.finished_at ? fmtTime(task.finished_at) + took : ""],
      ["Trace id", h("span", { class: "mono", id: "trace-id" }, task.trace_id)],
      ["Error", task.error ? h("span", { class: "err", id: "task-error" }, task.error) : ""],
    ]),
    h("h2", {}, "Steps"),
    ATTENTION.includes(task.status) && h("p", { class: "muted" },
      "What the completed steps returned (the ids of what they created: the upload, the charge) ",
      "is in their Output: clean up by hand what a failed compensation left, then resolve."),
    stepsTable(task.steps, source),
    h("h2", {}, "Timeline"),
    timelineTable(task),
    h("h2", {}, "Input and output"),
    facts([
      ["Input", valueBlock(task.input, source, { id: "task-input" })],
      ["Output", task.output == null ? "" : valueBlock(task.output, source, { id: "task-output" })],
    ]),
  ];
}

/**
 * An error cell. `past`: a later attempt succeeded, so the error is
 * history, shown muted and struck through rather than red.
 */
function errorCell(text, past, test) {
  if (!text) return h("td", { "data-test": test });
  if (!past) return h("td", { class: "err", "data-test": test }, text);
  return h("td", { class: "err past", "data-test": test, "data-past": true,
    title: "From an earlier attempt: a later one succeeded" },
  h("span", { class: "past-label" }, "earlier attempt:"), h("s", {}, text));
}

function stepsTable(steps, source) {
  const rows = steps.map((s) => h("tr", { "data-step": s.name },
    h("td", { class: "num" }, s.order),
    h("td", {}, s.name),
    h("td", {}, badge(s.status)),
    h("td", { class: "num" }, s.attempt_count),
    h("td", { class: "num" }, s.compensation_attempts || ""),
    h("td", { "data-test": "output" }, s.output === undefined || (s.output === null && !s.completed_at) ? ""
      : valueBlock(s.output, source)),
    // The step's error is past once the step completed after it; the
    // compensation's once the step is compensated after it.
    errorCell(s.error, s.completed_at != null, "error"),
    errorCell(s.compensation_error, s.status === "Compensated", "compensation-error"),
    h("td", {}, s.next_attempt_at ? h("span", { title: fmtTime(s.next_attempt_at) }, fmtIn(s.next_attempt_at)) : "")));
  return table({ id: "steps" }, [{ text: "#", attrs: { class: "num" } }, "Step", "Status",
    { text: "Attempts", attrs: { class: "num" } }, { text: "Undo attempts", attrs: { class: "num" } },
    { text: "Output", attrs: { title: "What the step returned: what to clean up by hand if its compensation failed" } },
    "Last error", "Compensation error", "Next attempt"], rows);
}

/** Prose for each kind of audit entry; a kind added later reads as words too. */
const KIND_TEXT = {
  CircuitOpen: "not called: its circuit breaker is open",
  StepCompleted: "step completed",
  StepCompensated: "step compensated (undone)",
  CompensationFailed: "compensation failed for good: an operator must clean up",
  CancellationRequested: "cancellation requested",
  DeadLettered: "parked in the dead-letter queue",
  Requeued: "requeued from the dead-letter queue by hand",
  Resolved: "resolved by hand",
  CompensationRetried: "compensation retried by hand",
  DeadLetterDiscarded: "dead letter discarded by hand",
  AttemptAbandoned: "attempt abandoned: its worker stopped or lost its lease",
  DuplicateAttempt: "duplicate attempt skipped: already claimed",
};

/** What an audit entry's kind says, with the fields its kind adds. */
function kindText(entry) {
  const retry = entry.retry_in_ms != null ? `, retry in ${fmtDuration(entry.retry_in_ms)}` : "";
  switch (entry.kind) {
    case "StatusChanged":
      return [h("span", { class: "muted" }, "status "), badge(entry.from), " \u2192 ", badge(entry.to)];
    case "AttemptFailed":
      return `attempt failed${retry || (entry.permanent ? " (permanent error)" : " (retries used up)")}`;
    case "CompensationAttemptFailed":
      return `compensation attempt failed${retry}`;
    case "LimitWait":
      return `waiting for limit ${entry.limit}${entry.key != null ? ` (key ${entry.key})` : ""}: no attempt made, none counted`;
    default: return KIND_TEXT[entry.kind] || words(entry.kind);
  }
}

/**
 * The audit entries (by index) whose error a later entry made good: a
 * failed attempt (or the dead letter) of a step that completed later; a failed attempt of a
 * compensation, or its failure for good, when the step was compensated
 * later (after a retry by hand, say). Compensations run one at a time, so
 * a compensation attempt's outcome is the next `StepCompensated` or
 * `CompensationFailed` after it (its entries name the compensation
 * method, theirs the step).
 */
function madeGood(log) {
  const past = new Set();
  const completed = new Set();
  const compensated = new Set();
  let compensationOutcome = null;
  for (let i = log.length - 1; i >= 0; i--) {
    const e = log[i];
    switch (e.kind) {
      case "StepCompleted": completed.add(e.step); break;
      case "StepCompensated": compensated.add(e.step); compensationOutcome = "good"; break;
      case "CompensationFailed":
        compensationOutcome = compensated.has(e.step) ? "good" : "bad";
        if (compensationOutcome === "good") past.add(i);
        break;
      case "CompensationAttemptFailed": if (compensationOutcome === "good") past.add(i); break;
      case "AttemptFailed": case "AttemptAbandoned": case "CircuitOpen":
        if (completed.has(e.step)) past.add(i);
        break;
      // Parked, then requeued by hand and through.
      case "DeadLettered":
        if (completed.has(e.step) || compensated.has(e.step)) past.add(i);
        break;
      default: break;
    }
  }
  return past;
}

function timelineTable(task) {
  const past = madeGood(task.audit_log);
  const rows = task.audit_log.map((e, i) => h("tr", { "data-kind": e.kind },
    h("td", { class: "mono nowrap", title: fmtTime(e.at) }, fmtClock(e.at)),
    h("td", { class: "num muted nowrap" }, `+${e.at - task.created_at} ms`),
    h("td", { class: "what", title: e.kind }, kindText(e)),
    h("td", {}, e.step || ""),
    h("td", { class: "num" }, e.attempt == null ? "" : e.attempt),
    errorCell(e.error, past.has(i), "error"),
    h("td", { class: "details" }, fmtDetails(e.details)),
    h("td", { class: "mono muted nowrap" }, e.worker || "")));
  return table({ id: "timeline" }, ["Time", { text: "Since start", attrs: { class: "num" } }, "What", "Step",
    { text: "Attempt", attrs: { class: "num" } }, "Error", "Details", "Worker"], rows, "No entry yet.");
}

// ---------------------------------------------------------------- attention

async function attentionView(view, params) {
  const list = h("div", { id: "attention-list" });
  const render = async () => {
    const page = await api(`/api/tasks${query({ status: "CompensationFailed", cursor: params.get("cursor"), limit: 50 })}`);
    const rows = page.tasks.map((t) => h("tr", { "data-task-id": t.id },
      h("td", {}, taskLink(t.id)),
      h("td", {}, t.saga),
      h("td", {}, t.step || ""),
      h("td", { class: "err" }, t.error || ""),
      h("td", {}, fmtTime(t.finished_at)),
      h("td", {}, h("div", { class: "actions" },
        actionButton("Resolve", "resolve", () => resolveTask(t.id, render), "primary"),
        actionButton("Retry compensation", "retry-compensation", () => retryCompensation(t.id, render))))));
    list.replaceChildren(
      table({ id: "attention" }, [{ text: "Task", attrs: { title: ID_PREFIX_NOTE } }, "Saga", "Step", "Error", "Failed at", ""], rows,
        "No task waits for an operator."),
      pager(params, page.next, "/attention"));
  };
  await render();
  view.mount(
    h("h1", {}, "Needs attention", h("button", { onclick: () => render().catch(showError), "data-test": "refresh" }, "Refresh")),
    h("p", { class: "muted" }, "Tasks whose compensation failed after its retries. Fix what they left behind and ",
      "resolve them, or retry the compensation once its cause is gone. Parked tasks are on the ",
      h("a", { href: "#/dead-letters" }, "dead-letter page"), "."),
    list);
  view.every(LIST_REFRESH_MS, render);
}

