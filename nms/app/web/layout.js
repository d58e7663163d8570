// Leaf-spine layout: one row per tier (superspine, spine, leaf, host: the server's `tier`), top to
// bottom; each row after the first ordered by where its neighbours above sit, so hosts line up
// under their leaf.
export const ROW_GAP = 150;
export const NODE_GAP = 96;
export const MARGIN = 50;

const byName = (a, b) => a.localeCompare(b, undefined, { numeric: true });

export function layout(topology) {
  const neighbours = new Map(topology.nodes.map((n) => [n.name, []]));
  for (const link of topology.links) {
    const a = link.a.split(":")[0];
    const b = link.b.split(":")[0];
    neighbours.get(a)?.push(b);
    neighbours.get(b)?.push(a);
  }
  const rows = new Map();
  for (const node of topology.nodes) {
    if (!rows.has(node.tier)) rows.set(node.tier, []);
    rows.get(node.tier).push(node);
  }
  const tiers = [...rows.keys()].sort((a, b) => a - b);
  const widest = Math.max(1, ...[...rows.values()].map((r) => r.length));
  const width = widest * NODE_GAP + 2 * MARGIN;
  const pos = new Map();
  tiers.forEach((tier, r) => {
    const row = rows.get(tier);
    const key = new Map(row.map((n) => {
      const above = neighbours.get(n.name).filter((m) => pos.has(m)).map((m) => pos.get(m).x);
      return [n.name, above.length ? above.reduce((s, x) => s + x, 0) / above.length : Infinity];
    }));
    row.sort((a, b) => (key.get(a.name) - key.get(b.name)) || byName(a.name, b.name));
    const step = (width - 2 * MARGIN) / row.length;
    row.forEach((n, i) => pos.set(n.name, { x: MARGIN + step * (i + 0.5), y: MARGIN + r * ROW_GAP }));
  });
  return { width, height: 2 * MARGIN + Math.max(0, tiers.length - 1) * ROW_GAP, pos };
}
