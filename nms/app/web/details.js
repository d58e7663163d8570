// The details panel: what was clicked, and the incidents on it with their evidence. Built with
// textContent only: names come from LLDP and the config, never parsed as HTML.
import { formatBps } from "./draw.js";

function add(parent, tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  parent.appendChild(e);
  return e;
}

function format(value) {
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toPrecision(4);
  if (Array.isArray(value)) return value.map((v) => (typeof v === "object" ? JSON.stringify(v) : format(v))).join(", ");
  if (value === null || value === undefined) return "-";
  return String(value);
}

// {a: {b: 1}} -> [["a.b", "1"]]: the numbers that decided an incident, one per row.
export function flatten(obj, prefix = "", out = []) {
  for (const [k, v] of Object.entries(obj ?? {})) {
    const key = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) flatten(v, key, out);
    else out.push([key, format(v)]);
  }
  return out;
}

function table(parent, rows, cls) {
  const t = add(parent, "table", undefined, cls);
  for (const [k, v] of rows) {
    const tr = add(t, "tr");
    add(tr, "th", k);
    add(tr, "td", v);
  }
  return t;
}

// Open incidents in list order: newest top-level first, each followed by its children (the incidents
// its failure explains, docs/correlator.md); a child whose parent is not open is listed on its own.
export function incidentTree(incidents) {
  const all = [...incidents];
  const ids = new Set(all.map((i) => i.id));
  const top = all.filter((i) => i.parent_id == null || !ids.has(i.parent_id)).sort((a, b) => b.id - a.id);
  return top.flatMap((p) => [{ inc: p, child: false },
    ...all.filter((c) => c.parent_id === p.id).sort((a, b) => a.id - b.id).map((c) => ({ inc: c, child: true }))]);
}

export function incidentBlock(parent, inc) {
  const box = add(parent, "div", undefined, `incident-detail sev-${inc.severity}`);
  box.dataset.incident = inc.id;
  add(box, "h3", `#${inc.id} ${inc.kind} (${inc.severity})`);
  add(box, "p", inc.summary, "summary");
  table(box, [["element", inc.element], ["direction", inc.direction ?? "-"],
              ["confidence", format(inc.confidence)], ["opened", new Date(inc.opened_ns / 1e6).toISOString()],
              ["jobs", format(inc.jobs)], ["acknowledged by", inc.acknowledged_by ?? "-"],
              ...(inc.parent_id != null ? [["explained by", `#${inc.parent_id}`]] : []),
              ...(inc.children?.length ? [["explains", inc.children.map((i) => `#${i}`).join(" ")]] : [])]);
  add(box, "h4", "evidence");
  table(box, flatten(inc.evidence), "evidence");
}

export function show(panel, what, ctx) {
  panel.replaceChildren();
  if (what.incident !== undefined) {
    const inc = ctx.incidents.get(what.incident);
    if (inc) incidentBlock(panel, inc);
    else add(panel, "p", `incident #${what.incident} is resolved`, "hint");
    return;
  }
  if (what.link) {
    const s = ctx.links[what.link] ?? {};
    add(panel, "h3", what.link);
    table(panel, [["state", s.state ?? "-"], ["cabling", s.check ?? "-"], ["flapping", s.flapping ? "yes" : "no"],
                  ["utilization", s.utilization == null ? "-" : `${(s.utilization * 100).toFixed(1)} %`],
                  ["a -> b", formatBps(s.bps_ab)], ["b -> a", formatBps(s.bps_ba)], ["expected", s.expected ?? "-"]]);
  } else if (what.node) {
    const n = ctx.topology?.nodes.find((x) => x.name === what.node);
    add(panel, "h3", what.node);
    if (n) table(panel, [["kind", n.kind], ["role", n.role ?? "-"], ["in inventory", n.configured ? "yes" : "no"],
                         ["reachable", n.reachable == null ? "-" : n.reachable ? "yes" : "no"]]);
  }
  for (const inc of ctx.incidentsOn(what)) incidentBlock(panel, inc);
}
