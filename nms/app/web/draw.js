// The SVG drawing: nodes and links as elements keyed by name (data-node, data-link), looks set by
// classes only (the page's CSP allows no inline style), tooltips as <title>.
const SVG = "http://www.w3.org/2000/svg";

function el(name, attrs = {}, parent = null) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (parent) parent.appendChild(e);
  return e;
}

function titled(parent, text) {
  let t = parent.querySelector(":scope > title");
  if (!t) t = el("title", {}, parent);
  t.textContent = text;
}

export function formatBps(bps) {
  if (bps === null || bps === undefined) return "-";
  const units = ["bit/s", "kbit/s", "Mbit/s", "Gbit/s", "Tbit/s"];
  let i = 0;
  while (bps >= 1000 && i < units.length - 1) { bps /= 1000; i += 1; }
  return `${bps.toFixed(bps < 10 && i > 0 ? 1 : 0)} ${units[i]}`;
}

// What a link looks like: broken states first, then its utilization bucket.
export function lookOf(status) {
  if (!status) return "unknown";
  if (status.state === "down") return "down";
  if (status.check === "missing") return "missing";
  if (status.check === "miscabled") return "miscabled";
  if (status.check === "unexpected") return "unexpected";
  if (status.flapping || status.state === "degraded") return "degraded";
  if (status.state === "unknown") return "unknown";
  const u = status.utilization ?? 0;
  return `util-${Math.min(9, Math.max(0, Math.floor(u * 10)))}`;
}

const LOOK_CLASS = { down: "state-down", missing: "check-missing", miscabled: "check-miscabled",
                     unexpected: "check-unexpected", degraded: "state-degraded", unknown: "state-unknown" };

export class Drawing {
  constructor(svg, onSelect) {
    this.svg = svg;
    this.onSelect = onSelect;
    this.links = new Map();  // id -> <g>
    this.nodes = new Map();  // name -> <g>
  }

  build(topology, placed) {
    this.svg.replaceChildren();
    this.links.clear();
    this.nodes.clear();
    this.svg.setAttribute("viewBox", `0 0 ${placed.width} ${placed.height}`);
    const linkLayer = el("g", { class: "links" }, this.svg);
    const markLayer = el("g", { class: "marks" }, this.svg);
    const nodeLayer = el("g", { class: "nodes" }, this.svg);
    this.markLayer = markLayer;
    const parallel = new Map();
    for (const link of topology.links) {
      const a = placed.pos.get(link.a.split(":")[0]);
      const b = placed.pos.get(link.b.split(":")[0]);
      if (!a || !b) continue;
      const pair = [link.a.split(":")[0], link.b.split(":")[0]].sort().join(" ");
      const k = parallel.get(pair) ?? 0;
      parallel.set(pair, k + 1);
      const shift = k === 0 ? 0 : (k % 2 ? 1 : -1) * Math.ceil(k / 2) * 6;  // parallel cables side by side
      const g = el("g", { class: "link state-unknown", "data-link": link.id, "data-look": "unknown" }, linkLayer);
      const ends = { x1: a.x + shift, y1: a.y, x2: b.x + shift, y2: b.y };
      el("line", { ...ends, class: "wire" }, g);
      el("line", { ...ends, class: "hit" }, g);
      titled(g, `${link.a} - ${link.b}`);
      g.addEventListener("click", () => this.onSelect({ link: link.id }));
      g.mid = { x: (a.x + b.x) / 2 + shift, y: (a.y + b.y) / 2 };
      g.ends = [link.a, link.b];
      this.links.set(link.id, g);
    }
    for (const node of topology.nodes) {
      const p = placed.pos.get(node.name);
      const g = el("g", { class: `node tier-${node.tier} kind-${node.kind}`, "data-node": node.name,
                          transform: `translate(${p.x},${p.y})` }, nodeLayer);
      if (node.reachable === false) g.classList.add("unreachable");
      el("rect", { x: -40, y: -14, width: 80, height: 28, rx: 6 }, g);
      const label = el("text", { y: 5, "text-anchor": "middle" }, g);
      label.textContent = node.name.length > 12 ? `${node.name.slice(0, 11)}…` : node.name;
      titled(g, `${node.name} (${node.role ?? node.kind})${node.reachable === false ? ": not reachable" : ""}`);
      g.addEventListener("click", () => this.onSelect({ node: node.name }));
      g.pos = p;
      this.nodes.set(node.name, g);
    }
  }

  // Apply one `links` event: a class per look, data-* for tests and tooltips.
  update(statuses) {
    const now = Date.now();
    for (const [id, g] of this.links) {
      const status = statuses[id];
      const look = lookOf(status);
      if (g.dataset.look !== look) {
        g.classList.remove(...[...g.classList].filter((c) => c !== "link" && !c.startsWith("job") &&
                                                        c !== "incident" && c !== "selected" && c !== "dim"));
        g.classList.add(LOOK_CLASS[look] ?? look);
        g.dataset.look = look;
        g.dataset.changedMs = String(now);
      }
      g.dataset.state = status?.state ?? "unknown";
      g.dataset.check = status?.check ?? "unknown";
      const util = status?.utilization;
      titled(g, `${g.ends[0]} - ${g.ends[1]}\nstate ${status?.state ?? "?"}, cabling ${status?.check ?? "?"}` +
                `${status?.flapping ? ", flapping" : ""}\nutilization ${util == null ? "-" : (util * 100).toFixed(1) + " %"}` +
                `\n${g.ends[0]} -> ${formatBps(status?.bps_ab)}\n${g.ends[1]} -> ${formatBps(status?.bps_ba)}` +
                `${status?.expected ? "\n" + status.expected : ""}`);
    }
  }

  // Incidents on their elements: a class on the element and a marker with the summary.
  markIncidents(incidents, onPick) {
    if (!this.markLayer) return;  // not drawn yet: build() marks them
    for (const g of [...this.links.values(), ...this.nodes.values()]) {
      g.classList.remove("incident");
      delete g.dataset.incident;
    }
    this.markLayer.replaceChildren();
    for (const inc of incidents) {
      for (const target of this.targets(inc)) {
        target.classList.add("incident");
        target.dataset.incident = [target.dataset.incident, inc.id].filter(Boolean).join(" ");
        const at = target.mid ?? { x: target.pos.x + 40, y: target.pos.y - 14 };
        const mark = el("circle", { cx: at.x, cy: at.y, r: 9, class: `incident-mark sev-${inc.severity}`,
                                    "data-incident": inc.id }, this.markLayer);
        titled(mark, `#${inc.id} ${inc.kind} (${inc.severity}): ${inc.summary}`);
        mark.addEventListener("click", () => onPick(inc.id));
      }
    }
  }

  // The drawn elements an incident names (docs: Finding.element).
  targets(inc) {
    const out = [];
    const name = inc.element;
    if (inc.element_kind === "link") {
      if (this.links.has(name)) out.push(this.links.get(name));
    } else if (inc.element_kind === "nic") {
      const host = name.split(":")[0];
      if (this.nodes.has(host)) out.push(this.nodes.get(host));
      for (const g of this.links.values()) if (g.ends.includes(name)) out.push(g);
    } else if (inc.element_kind === "device" || inc.element_kind === "host") {
      if (this.nodes.has(name)) out.push(this.nodes.get(name));
    } else if (inc.element_kind === "host_pair") {
      for (const host of name.split("--")) if (this.nodes.has(host)) out.push(this.nodes.get(host));
    }
    return out;
  }

  select(what) {
    for (const g of [...this.links.values(), ...this.nodes.values()]) g.classList.remove("selected");
    const g = what?.link ? this.links.get(what.link) : what?.node ? this.nodes.get(what.node) : null;
    g?.classList.add("selected");
  }

  // The jobs overlay: its hosts, their leaves, the spines joining those leaves, the links between.
  showJob(job) {
    const all = [...this.links.values(), ...this.nodes.values()];
    for (const g of all) g.classList.remove("job", "dim");
    if (!job) return;
    const hosts = new Set(job.hosts);
    const leaves = new Set();
    for (const g of this.links.values()) {
      const [a, b] = g.ends.map((e) => e.split(":")[0]);
      if (hosts.has(a) && this.nodes.has(b)) leaves.add(b);
      if (hosts.has(b) && this.nodes.has(a)) leaves.add(a);
    }
    const upper = new Map();
    for (const g of this.links.values()) {
      const [a, b] = g.ends.map((e) => e.split(":")[0]);
      if (leaves.has(a) && !hosts.has(b) && !leaves.has(b)) upper.set(b, (upper.get(b) ?? new Set()).add(a));
      if (leaves.has(b) && !hosts.has(a) && !leaves.has(a)) upper.set(a, (upper.get(a) ?? new Set()).add(b));
    }
    const members = new Set([...hosts, ...leaves]);
    if (leaves.size > 1) for (const [spine, seen] of upper) if (seen.size > 1) members.add(spine);
    for (const [name, g] of this.nodes) g.classList.add(members.has(name) ? "job" : "dim");
    for (const g of this.links.values()) {
      const [a, b] = g.ends.map((e) => e.split(":")[0]);
      const used = members.has(a) && members.has(b) && (hosts.has(a) || hosts.has(b) || leaves.size > 1);
      g.classList.add(used ? "job" : "dim");
    }
  }
}
