// The live fabric view: /fabric/stream (topology, link states and utilization, jobs) and
// /incidents/stream?state=open (open incidents), both EventSource with the session cookie.
import { layout } from "./layout.js";
import { Drawing } from "./draw.js";
import { incidentTree, show } from "./details.js";

const $ = (id) => document.getElementById(id);
const body = document.body;
const state = { topology: null, links: {}, jobs: [], incidents: new Map(), selected: null };
let cspViolations = 0;

// The browser test reads this: the page must never trip its own CSP.
document.addEventListener("securitypolicyviolation", () => {
  cspViolations += 1;
  body.dataset.cspViolations = String(cspViolations);
});
body.dataset.cspViolations = "0";

const drawing = new Drawing($("fabric"), select);

state.incidentsOn = (what) => [...state.incidents.values()].filter((inc) =>
  drawing.targets(inc).some((g) => (what.link && g.dataset.link === what.link) ||
                                   (what.node && g.dataset.node === what.node)));

function select(what) {
  state.selected = what;
  drawing.select(what);
  show($("details"), what, state);
}

function refreshDetails() {
  if (state.selected) show($("details"), state.selected, state);
}

function setLive(which, text) {
  $("live").dataset[which] = text;
  const ok = $("live").dataset.fabric === "live" && $("live").dataset.incidents === "live";
  $("live").dataset.state = ok ? "live" : "reconnecting";
  $("live").textContent = ok ? "live" : "reconnecting";
}

async function sessionGone() {
  const r = await fetch("/ui/session", { credentials: "same-origin" });
  if (r.status === 401 || r.status === 403) window.location.assign("/ui/login");
  return !r.ok;
}

function follow(url, which, handlers) {
  const source = new EventSource(url);
  source.addEventListener("open", () => { setLive(which, "live"); handlers.open?.(); });
  source.addEventListener("error", async () => {
    setLive(which, "down");
    // EventSource retries by itself after a dropped connection, not after a refusal
    if (source.readyState === EventSource.CLOSED && !(await sessionGone())) {
      setTimeout(() => follow(url, which, handlers), 2000);
    }
  });
  for (const [name, fn] of Object.entries(handlers)) {
    if (name !== "open") source.addEventListener(name, (e) => fn(JSON.parse(e.data)));
  }
  return source;
}

// --- the fabric ----------------------------------------------------------------------------
follow("/fabric/stream", "fabric", {
  topology(topo) {
    state.topology = topo;
    drawing.build(topo, layout(topo));
    drawing.update(state.links);
    drawing.markIncidents(state.incidents.values(), (id) => select({ incident: id }));
    drawing.showJob(state.jobs.find((j) => j.id === $("job").value));
    body.dataset.links = String(topo.links.length);
    body.dataset.nodes = String(topo.nodes.length);
  },
  links(update) {
    state.links = update.links;
    drawing.update(update.links);
    body.dataset.linksTs = String(update.ts);
    if (state.selected?.link) refreshDetails();
  },
  jobs(update) {
    state.jobs = update.jobs;
    const select = $("job");
    const current = select.value;
    select.replaceChildren(new Option("(none)", ""));
    for (const job of update.jobs) select.add(new Option(`${job.id}${job.name ? " " + job.name : ""} (${job.hosts.length} hosts)`, job.id));
    select.value = update.jobs.some((j) => j.id === current) ? current : "";
    drawing.showJob(state.jobs.find((j) => j.id === select.value));
  },
  link_event(event) {
    const li = document.createElement("li");
    li.textContent = `${new Date(event.ts / 1e6).toLocaleTimeString()} ${event.device}:${event.port} ` +
                     `${event.previous ?? "?"} -> ${event.state}`;
    $("changes").prepend(li);
    while ($("changes").children.length > 50) $("changes").lastChild.remove();
  },
});

$("job").addEventListener("change", () => drawing.showJob(state.jobs.find((j) => j.id === $("job").value)));

// --- incidents -----------------------------------------------------------------------------
function renderIncidents() {
  const list = $("incidents");
  list.replaceChildren();
  const open = [...state.incidents.values()].sort((a, b) => b.id - a.id);
  const rows = incidentTree(open);
  for (const { inc, child } of rows) {
    const li = document.createElement("li");
    li.className = `sev-${inc.severity}` + (child ? " child" : "");
    li.dataset.incident = inc.id;
    li.textContent = `${child ? "└ " : ""}#${inc.id} ${inc.kind} ${inc.element}`;
    li.title = inc.summary;
    li.addEventListener("click", () => select({ incident: inc.id }));
    list.appendChild(li);
  }
  $("incident-count").textContent = String(rows.filter((r) => !r.child).length);  // one per failure
  body.dataset.incidents = open.map((i) => i.id).join(" ");
  drawing.markIncidents(open, (id) => select({ incident: id }));
  refreshDetails();
}

const changed = (event) => { state.incidents.set(event.incident.id, event.incident); renderIncidents(); };

// The stream carries an incident when it changes the way an operator calls a change; its evidence
// (loss, delay, paths) is refreshed in the store every correlator window without an event. So the
// open incidents the details panel shows are read again every REFRESH_MS while it shows them.
const REFRESH_MS = 3000;
async function refreshShown() {
  const ids = [...document.querySelectorAll("#details [data-incident]")].map((el) => Number(el.dataset.incident));
  let changedAny = false;
  for (const id of new Set(ids)) {
    if (!state.incidents.has(id)) continue;
    const r = await fetch(`/incidents/${id}`, { credentials: "same-origin" });
    if (!r.ok) continue;
    const now = await r.json();
    const held = state.incidents.get(id);
    // only newer than what the stream gave meanwhile, and only while still open here
    if (!held || now.state !== "open" || now.last_seen_ns < held.last_seen_ns) continue;
    state.incidents.set(id, { ...held, evidence: now.evidence, summary: now.summary,
                              last_seen_ns: now.last_seen_ns });
    changedAny = true;
  }
  if (changedAny) refreshDetails();
}
setInterval(() => { refreshShown().catch(() => {}); }, REFRESH_MS);
follow("/incidents/stream?state=open", "incidents", {
  open() { state.incidents.clear(); renderIncidents(); },  // the snapshot that follows is the whole truth
  snapshot(incident) { state.incidents.set(incident.id, incident); renderIncidents(); },
  opened: changed,
  updated: changed,
  acknowledged: changed,
  resolved(event) { state.incidents.delete(event.incident.id); renderIncidents(); },
});

// --- session ----------------------------------------------------------------------------------
fetch("/ui/session", { credentials: "same-origin" }).then(async (r) => {
  if (!r.ok) { window.location.assign("/ui/login"); return; }
  const who = await r.json();
  $("user").textContent = `${who.name} (${who.scopes.join(", ")})`;
});

$("logout").addEventListener("click", async () => {
  await fetch("/ui/session", { method: "DELETE", credentials: "same-origin" });
  window.location.assign("/ui/login");
});
