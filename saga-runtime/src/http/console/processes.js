// ---------------------------------------------------------------- dead letters

async function deadLettersView(view, params) {
  const list = h("div", { id: "dead-letter-list" });
  const render = async () => {
    const page = await api(`/api/dead-letters${query({ cursor: params.get("cursor"), limit: 50 })}`);
    const rows = page.letters.map((l) => h("tr", { "data-letter-id": l.id, "data-task-id": l.task_id || "" },
      h("td", { class: "mono" }, l.id),
      h("td", {}, fmtTime(l.at)),
      h("td", { class: "err", title: l.reason }, l.reason),
      h("td", {}, l.saga || ""),
      h("td", {}, l.step || ""),
      h("td", {}, l.task_status ? badge(l.task_status) : ""),
      h("td", {}, l.task_id ? taskLink(l.task_id) : h("span", { class: "muted" }, "none")),
      h("td", {}, h("div", { class: "actions" },
        actionButton("Requeue", "requeue", () => requeueLetter(l.id, render), "primary"),
        actionButton("Discard", "discard", () => discardLetter(l.id, render), "danger")))));
    list.replaceChildren(
      table({ id: "dead-letters" }, ["Id", "At", "Reason", "Saga", "Step", "Task status",
        { text: "Task", attrs: { title: ID_PREFIX_NOTE } }, ""], rows,
        "The dead-letter queue is empty."),
      pager(params, page.next, "/dead-letters"));
  };
  await render();
  view.mount(
    h("h1", {}, "Dead letters", h("button", { onclick: () => render().catch(showError), "data-test": "refresh" }, "Refresh")),
    bulkRequeueForm(render),
    list);
  view.every(LIST_REFRESH_MS, render);
}

function bulkRequeueForm(after) {
  const onsubmit = (event) => {
    event.preventDefault();
    const data = Object.fromEntries(new FormData(event.target));
    const selection = {};
    for (const key of ["saga", "step", "error_contains"]) if (data[key].trim()) selection[key] = data[key].trim();
    if (data.max) selection.max = Number(data.max);
    act(() => api("/api/dead-letters/requeue", "POST", selection),
      (r) => `Looked at ${r.scanned}, requeued ${r.done.length}` +
        (r.failed.length ? `, failed ${r.failed.length}: ${r.failed.map((f) => f.join(": ")).join("; ")}` : "."),
      after);
  };
  return h("form", { class: "bulk", id: "bulk-requeue", onsubmit },
    h("strong", {}, "Requeue every letter where"),
    h("label", {}, "Saga", h("input", { name: "saga", placeholder: "any" })),
    h("label", {}, "Step", h("input", { name: "step", placeholder: "any" })),
    h("label", {}, "Error contains", h("input", { name: "error_contains", placeholder: "any" })),
    h("label", {}, "At most", h("input", { name: "max", type: "number", min: 1, placeholder: "1000", class: "narrow" })),
    h("button", { type: "submit", class: "action primary", "data-test": "bulk-requeue", disabled: !settings.changesAllowed }, "Requeue"));
}

// ---------------------------------------------------------------- process managers

const INSTANCE_STATUSES = ["Active", "Completed", "Stopped"];

/** A process manager in `GET /api/processes`: its name, or an object with it (and its counts). */
function processName(p) {
  return typeof p === "string" ? p : p.name;
}

/** Its instances by status (`{Active: 3, ...}`), where the API counted them, else null. */
function processCounts(p) {
  return (p && typeof p === "object" && p.counts) || null;
}

/** Its number of instances, where the API gives it (or its counts add up to it), else null. */
function processTotal(p) {
  if (!p || typeof p !== "object") return null;
  if (typeof p.total === "number") return p.total;
  const counts = processCounts(p);
  return counts ? Object.values(counts).reduce((a, b) => a + b, 0) : null;
}

async function processesView(view) {
  const { processes } = await api("/api/processes");
  const counted = processes.some((p) => processTotal(p) != null);
  const statuses = [...new Set([...INSTANCE_STATUSES,
    ...processes.flatMap((p) => Object.keys(processCounts(p) || {}))])];
  const rows = processes.map((p) => {
    const name = processName(p);
    const href = `#/process/${encodeURIComponent(name)}`;
    const counts = processCounts(p);
    const total = processTotal(p);
    // A count links to the instances in that status; a blank one was not
    // counted (the API counts by status up to a limit).
    const cells = !counted ? [] : [
      ...statuses.map((status) => {
        const n = counts ? counts[status] || 0 : null;
        return h("td", { class: `num${n ? "" : " zero"}`, "data-status": status, "data-count": n ?? "" },
          n ? h("a", { href: `${href}${query({ status })}` }, n) : n == null ? "" : "0");
      }),
      h("td", { class: "num", "data-status": "total" }, total == null ? "" : h("a", { href }, total)),
    ];
    return h("tr", { "data-process": name }, h("td", {}, h("a", { href }, name)), cells);
  });
  const headers = ["Name", ...(counted ? [...statuses.map((s) => ({ text: statusLabel(s), attrs: { class: "num", title: s } })),
    { text: "Instances", attrs: { class: "num" } }] : [])];
  view.mount(h("h1", {}, "Process managers"),
    table({ id: "processes" }, headers, rows, "No process manager registered."));
}

/** Oldest first, then by id: an order that stays put while instances change. */
function byCreation(a, b) {
  return (a.created_at - b.created_at) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
}

async function processView(view, params, name) {
  const status = params.get("status") || "";
  const path = `/api/processes/${encodeURIComponent(name)}/instances`;
  const paging = { cursor: params.get("cursor"), limit: 50 };
  let page;
  let filteredHere = false;
  try {
    page = await api(`${path}${query({ ...paging, status })}`);
  } catch (err) {
    // A server without the status filter refuses the parameter: filter the
    // page here instead, and say so.
    if (!status || err.status !== 400) throw err;
    page = await api(`${path}${query(paging)}`);
    filteredHere = true;
  }
  const instances = page.instances.filter((i) => !status || i.status === status);
  const base = `#/process/${encodeURIComponent(name)}`;
  const rows = instances.sort(byCreation).map((i) => h("tr", { "data-instance-id": i.id, "data-created": i.created_at },
    h("td", {}, h("a", { class: "mono", href: `${base}/${encodeURIComponent(i.id)}` }, i.id)),
    h("td", {}, badge(i.status)),
    h("td", { class: "num" }, i.version),
    h("td", {}, fmtTime(i.created_at)),
    h("td", {}, fmtTime(i.updated_at)),
    h("td", {}, h("code", {}, JSON.stringify(i.state)))));
  view.mount(h("h1", {}, "Process manager ", h("span", { class: "mono" }, name)),
    instanceFilterForm(name, status),
    filteredHere && h("p", { class: "muted", id: "filtered-here" },
      "This server cannot filter by status: the page shows the matching instances of this page only."),
    table({ id: "instances" }, ["Instance", "Status", { text: "Version", attrs: { class: "num" } }, "Created", "Updated", "State"],
      rows, status ? `No ${statusLabel(status)} instance.` : "No instance."),
    pager(params, page.next, `/process/${encodeURIComponent(name)}`));
}

function instanceFilterForm(name, status) {
  const onsubmit = (event) => {
    event.preventDefault();
    const data = Object.fromEntries(new FormData(event.target));
    location.hash = `#/process/${encodeURIComponent(name)}${query(data)}`;
  };
  return h("form", { class: "filters", id: "instance-filters", onsubmit },
    h("label", {}, "Status", h("select", { name: "status" },
      h("option", { value: "" }, "any"),
      INSTANCE_STATUSES.map((s) => h("option", { value: s, selected: s === status }, statusLabel(s))))),
    h("button", { type: "submit", class: "primary" }, "Filter"),
    h("a", { href: `#/process/${encodeURIComponent(name)}` }, "Clear"));
}

async function instanceView(view, _params, name, id) {
  const { instance, timeouts } = await api(`/api/processes/${encodeURIComponent(name)}/instances/${encodeURIComponent(id)}`);
  const audit = instance.audit_log.map((e) => h("tr", { "data-kind": e.kind },
    h("td", {}, fmtTime(e.at)),
    h("td", {}, e.message_type),
    h("td", {}, badge(e.kind)),
    h("td", { class: "err" }, e.reason || e.error || ""),
    h("td", { class: "mono muted" }, e.message_id)));
  const pending = timeouts.map((t) => h("tr", {},
    h("td", {}, t.message_type),
    h("td", {}, fmtTime(t.due), " ", h("span", { class: "muted" }, fmtIn(t.due))),
    h("td", {}, t.tally_report ? "tally report" : "timeout")));
  view.mount(
    h("h1", {}, h("a", { href: `#/process/${encodeURIComponent(name)}` }, name), " / ", h("span", { class: "mono" }, id)),
    facts([["Status", badge(instance.status)], ["Version", instance.version],
      ["Created", fmtTime(instance.created_at)], ["Updated", fmtTime(instance.updated_at)]]),
    h("h2", {}, "State"), h("div", { id: "instance-state", class: "card" }, json(instance.state)),
    h("h2", {}, "Correlation keys"),
    table({ id: "keys" }, ["Field", "Value"], instance.keys.map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", { class: "mono" }, v))), "No key."),
    h("h2", {}, "Pending timeouts"),
    table({ id: "timeouts" }, ["Message", "Due", "Kind"], pending, "None pending."),
    h("h2", {}, "Audit"),
    table({ id: "instance-audit" }, ["At", "Message", "What", "Why", "Message id"], audit, "No entry."));
}

// ---------------------------------------------------------------- start

async function start() {
  loadAuthInputs();
  document.getElementById("action-form").addEventListener("submit", submitAction);
  document.getElementById("action-cancel").addEventListener("click", closeModal);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeModal(); });
  try {
    setChangesAllowed((await api("/api/overview")).changes_allowed);
  } catch (err) {
    // Without the token the page asks for it (`route`): nothing to report.
    if (!needsToken(err)) showError(err);
  }
  window.addEventListener("hashchange", route);
  await route();
}

start();
