"""Capacitated edge colouring of a bipartite multigraph: the step the path planner (planner.py) runs twice
(edge switches x planes, then pods x cores within a plane).

Every edge (a subflow from a left node to a right node) gets a colour (a plane, a core) so that colour a
is used at most cap[node, a] times at each node (a link carries at most that many subflows). Edges are
coloured one by one: a colour with room at both ends if there is one (most room first, a preferred colour
first among equals); otherwise an alternating-path swap (a Kempe chain, as in the constructive proof of
Konig's edge-colouring theorem): with alpha free at the left end and beta free at the right end, a
breadth-first search from the right end over alpha/beta edges finds a node with room, and the colours
along the path are swapped, which frees alpha at the right end. With one capacity for every node and
colour and every node's degree at most colours x capacity (a healthy fat tree at full load) this
always succeeds: the nodes the search reaches would need more alpha edges than they can hold
(docs/simulator.md). With uneven capacities (failed or busy links) it can fail; the edge is then left
uncoloured (-1) for the caller to repair or to lower the rate.
"""

from __future__ import annotations

from collections import deque

import numpy as np

PREFER_BONUS = 0.5  # a preferred colour wins ties on room, never a colour with less room


class Colouring:
    def __init__(self, left: np.ndarray, right: np.ndarray, cap_left: np.ndarray, cap_right: np.ndarray,
                 allowed: np.ndarray | None = None, groups: tuple[np.ndarray, np.ndarray] | None = None,
                 group_cap: tuple[np.ndarray, np.ndarray] | None = None):
        self.left, self.right = left.astype(np.int64), right.astype(np.int64)
        self.allowed = allowed  # edges x colours: the colours an edge may take (None: all)
        # optional second-level capacities: an edge in left group g (-1: none) uses one of group_cap[0][g, colour]
        # (the planner: a pod's core links in a plane); kept by the greedy step, checked edge by edge in swaps
        self.groups = None if groups is None else (groups[0].tolist(), groups[1].tolist())
        self.group_room = None if group_cap is None else [group_cap[0].astype(np.int64).copy(),
                                                          group_cap[1].astype(np.int64).copy()]
        self.colours = cap_left.shape[1]
        self.room = [cap_left.astype(np.int64).copy(), cap_right.astype(np.int64).copy()]  # [side][node, colour]
        self.colour = np.full(self.left.size, -1, np.int64)
        # edges per (side, node, colour): what a swap walks
        self.at: list[list[list[set[int]]]] = [[[set() for _ in range(self.colours)] for _ in range(cap.shape[0])]
                                               for cap in (cap_left, cap_right)]
        self.ends = (self.left.tolist(), self.right.tolist())

    def _set(self, e: int, colour: int) -> None:
        old = int(self.colour[e])
        for side in (0, 1):
            node = self.ends[side][e]
            if old >= 0:
                self.at[side][node][old].discard(e)
                self.room[side][node, old] += 1
            self.at[side][node][colour].add(e)
            self.room[side][node, colour] -= 1
            if self.groups is not None and self.group_room is not None and self.groups[side][e] >= 0:
                g = self.groups[side][e]
                if old >= 0:
                    self.group_room[side][g, old] += 1
                self.group_room[side][g, colour] -= 1
        self.colour[e] = colour

    def _group_room(self, e: int) -> np.ndarray | None:
        """Per colour, the room left in edge e's groups (None: e is in none)."""
        if self.groups is None or self.group_room is None:
            return None
        rooms = [self.group_room[side][self.groups[side][e]] for side in (0, 1) if self.groups[side][e] >= 0]
        return np.minimum(*rooms) if len(rooms) == 2 else (rooms[0] if rooms else None)

    def colour_all(self, order: np.ndarray, prefer: np.ndarray | None = None) -> np.ndarray:
        """Colours every edge in `order`; `prefer` (edges x colours, bool) breaks ties. Returns the colours
        (-1: no room found)."""
        room_l, room_r = self.room
        for e in order.tolist():
            u, v = self.ends[0][e], self.ends[1][e]
            common = np.minimum(room_l[u], room_r[v]).astype(float)
            grp = self._group_room(e)
            if grp is not None:
                common = np.minimum(common, grp)
            if self.allowed is not None:
                common[~self.allowed[e]] = -np.inf
            if prefer is not None:
                common += PREFER_BONUS * prefer[e]
            a = int(np.argmax(common))
            if common[a] >= 1:
                self._set(e, a)
            elif not self._swap_and_set(e, u, v):
                continue
        return self.colour

    def _swap_and_set(self, e: int, u: int, v: int) -> bool:
        room_l, room_r = self.room
        grp = self._group_room(e)
        alphas = np.flatnonzero((room_l[u] > 0) & (True if self.allowed is None else self.allowed[e]))
        rank = room_l[u][alphas] + (0 if grp is None else 1000 * np.minimum(grp[alphas], 1))  # group room first
        betas = np.flatnonzero(room_r[v] > 0)
        for alpha in alphas[np.argsort(-rank, kind="stable")][:3].tolist():
            for beta in betas[np.argsort(-room_r[v][betas], kind="stable")][:3].tolist():
                if self._kempe(e, v, alpha, beta):
                    self._set(e, alpha)
                    return True
        return False

    def _kempe(self, e_new: int, v: int, alpha: int, beta: int) -> bool:
        """Frees alpha at right node v for edge e_new: a shortest path v -alpha- l1 -beta- r1 -alpha- ... to
        a node that can take one more of the colour it gains (and, with groups, whose swaps together with
        e_new's alpha keep every group within its capacity), its edges' colours swapped."""
        parent: dict[tuple[int, int], tuple[int, int, int]] = {(1, v): (-1, -1, -1)}  # node -> (edge, prev)
        queue = deque([(1, v)])
        while queue:
            side, node = queue.popleft()
            shed, gain = (alpha, beta) if side == 1 else (beta, alpha)
            other = 1 - side
            for e in self.at[side][node][shed]:
                if self.allowed is not None and not self.allowed[e, gain]:
                    continue  # the swap would give this edge a colour it may not take
                nxt = (other, self.ends[other][e])
                if nxt in parent:
                    continue
                parent[nxt] = (e, side, node)
                if self.room[other][nxt[1], gain] > 0:
                    path = self._path(parent, nxt)
                    if self._groups_fit(path, e_new, alpha, beta):
                        for f, shedder in path:  # shed by a right node: alpha -> beta; by a left one: beta -> alpha
                            self._set(f, beta if shedder == 1 else alpha)
                        return True
                queue.append(nxt)  # with room but over a group: the path may go on through it
        return False

    @staticmethod
    def _path(parent, end) -> list[tuple[int, int]]:
        """(edge, side of the node that sheds it) from v to `end`."""
        path = []
        node = end
        while parent[node][0] >= 0:
            e, side, prev = parent[node]
            path.append((e, side))
            node = (side, prev)
        return path

    def _groups_fit(self, path: list[tuple[int, int]], e_new: int, alpha: int, beta: int) -> bool:
        if self.groups is None or self.group_room is None:
            return True
        delta: dict[tuple[int, int, int], int] = {}
        changes = [(f, beta, alpha) if shedder == 1 else (f, alpha, beta) for f, shedder in path]
        changes.append((e_new, alpha, -1))
        for f, new, old in changes:
            for side in (0, 1):
                g = self.groups[side][f]
                if g >= 0:
                    delta[side, g, new] = delta.get((side, g, new), 0) + 1
                    if old >= 0:
                        delta[side, g, old] = delta.get((side, g, old), 0) - 1
        return all(self.group_room[side][g, col] >= d for (side, g, col), d in delta.items() if d > 0)


def colour(left: np.ndarray, right: np.ndarray, cap_left: np.ndarray, cap_right: np.ndarray,
           order: np.ndarray | None = None, prefer: np.ndarray | None = None,
           allowed: np.ndarray | None = None, groups: tuple[np.ndarray, np.ndarray] | None = None,
           group_cap: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Colours for the edges (left[i], right[i]) within the capacities (nodes x colours); -1 where none.
    `allowed` (edges x colours) restricts an edge's colours, `prefer` (same shape) breaks ties;
    `groups`/`group_cap`: see Colouring."""
    c = Colouring(left, right, cap_left, cap_right, allowed, groups, group_cap)
    return c.colour_all(np.arange(left.size) if order is None else order, prefer)
