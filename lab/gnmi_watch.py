"""ON_CHANGE for the lab's gNMI target (lab/gnmi_target.py): one `LinkWatch` per target keeps the
status leaves of every interface current, woken by rtnetlink link messages (RTMGRP_LINK) and a
rescan every RESCAN_S; each ON_CHANGE stream's `OnChange` sends its client what differs from what
it holds (and deletes for interfaces that went away)."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import struct

from pygnmi.spec.v080 import gnmi_pb2

from lab.gnmi_tree import COUNTERS, Kernel, Selection, Snapshot, Values, deleted, fill, names_of, wanted_of

log = logging.getLogger("lab.gnmi_target")

RESCAN_S = 1.0
RTMGRP_LINK, RTM_NEWLINK, RTM_DELLINK, IFLA_IFNAME = 1, 16, 17, 3


def _link_names(data: bytes) -> set[str]:
    """Interface names of the RTM_NEWLINK/RTM_DELLINK messages in one rtnetlink datagram."""
    names, off = set(), 0
    while off + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, off)
        if length < 16:
            break
        if kind in (RTM_NEWLINK, RTM_DELLINK):
            a = off + 32  # after nlmsghdr (16) and ifinfomsg (16): rtattrs
            while a + 4 <= off + length:
                alen, atype = struct.unpack_from("=HH", data, a)
                if alen < 4:
                    break
                if atype == IFLA_IFNAME:
                    names.add(data[a + 4:a + alen].split(b"\0", 1)[0].decode(errors="replace"))
                a += (alen + 3) & ~3
        off += (length + 3) & ~3
    return names


class LinkWatch:
    """Status leaves of every interface, kept current for ON_CHANGE subscribers: the interfaces an
    rtnetlink link message names are re-read at once, all of them every RESCAN_S (what netlink
    does not report, or lost in a socket overrun). Runs while anyone subscribes."""

    def __init__(self, kernel: Kernel):
        self.kernel, self.status, self.version = kernel, {}, 0
        self._changed, self._wake = asyncio.Event(), asyncio.Event()
        self._dirty: set[str] | None = set()  # None: re-read everything
        self._users, self._task, self._ready = 0, None, asyncio.Event()

    async def acquire(self) -> None:
        self._users += 1
        if self._task is None:
            self._ready = asyncio.Event()
            self._task = asyncio.create_task(self._run())
        task = self._task
        try:
            await self._ready.wait()
        except asyncio.CancelledError:
            self.release()
            raise
        if task.done():  # it failed before its first read (logged)
            self.release()
            raise RuntimeError("the link watcher failed; see the target's log")

    def release(self) -> None:
        self._users -= 1
        if self._users == 0 and self._task is not None:
            self._task.cancel()
            self._task = None

    async def wait(self, version: int, timeout: float) -> None:
        """Until the status differs from `version`, or `timeout` seconds."""
        if self.version == version:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                pass

    def _readable(self, sock: socket.socket) -> None:
        while True:
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    break
                self._dirty = None  # messages were lost
                continue
            if self._dirty is not None:
                self._dirty |= _link_names(data)
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        sock = None
        try:
            try:
                sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, socket.NETLINK_ROUTE)
                sock.bind((0, RTMGRP_LINK))
                loop.add_reader(sock.fileno(), self._readable, sock)
            except OSError as e:
                log.warning("no rtnetlink link events (%s): status changes show at the %g s rescan", e, RESCAN_S)
                sock = None
            self.status = await asyncio.to_thread(self.kernel.read, False, True)
            self._ready.set()
            full_at = loop.time() + RESCAN_S
            while True:
                try:
                    await asyncio.wait_for(self._wake.wait(), max(0.0, full_at - loop.time()))
                    await asyncio.sleep(0.002)  # one change brings several messages: read once
                    dirty = self._dirty
                except TimeoutError:
                    dirty = None
                if dirty is None:
                    full_at = loop.time() + RESCAN_S
                self._wake.clear()
                self._dirty = set()
                await self._refresh(dirty)
        except Exception:
            log.exception("link watcher failed")
            raise
        finally:
            self._ready.set()  # never leave a subscriber waiting
            if sock is not None:
                loop.remove_reader(sock.fileno())
                sock.close()

    async def _refresh(self, dirty: set[str] | None) -> None:
        if dirty is None:
            new = await asyncio.to_thread(self.kernel.read, False, True)
        elif dirty:
            fresh = await asyncio.to_thread(self.kernel.read, False, True, sorted(dirty))
            new = {n: v for n, v in self.status.items() if n not in dirty} | fresh
        else:
            return
        changed = new.keys() != self.status.keys() or any(new[n][1] != self.status[n][1] for n in new)
        self.status = new
        if changed:
            self.version += 1
            self._changed.set()
            self._changed = asyncio.Event()


class OnChange:
    """A stream's ON_CHANGE selections: what its client holds, and the updates that bring it level
    with the current values (status from the LinkWatch, counters read when selected)."""

    def __init__(self, kernel: Kernel, watch: LinkWatch, selections: list[Selection]):
        self.kernel, self.watch, self.selections = kernel, watch, selections
        self.counters = any(sel.leaves & COUNTERS.keys() for sel in selections)
        self.sent: dict[str, Values] = {}

    async def current(self) -> Snapshot:
        status = self.watch.status
        if not self.counters:
            return status
        counts = await asyncio.to_thread(self.kernel.read, True, False, names_of(self.selections))
        return {n: (max(ts, status[n][0]), {**status[n][1], **v}) for n, (ts, v) in counts.items() if n in status}

    def diff(self, snapshot: Snapshot) -> list[gnmi_pb2.SubscribeResponse]:
        wanted = wanted_of(self.selections, snapshot)
        out = [deleted(n) for n in self.sent if n not in wanted]
        for n in [n for n in self.sent if n not in wanted]:
            del self.sent[n]
        for name, leaves in wanted.items():
            ts, values = snapshot[name]
            held = self.sent.setdefault(name, {})
            changed = frozenset(leaf for leaf in leaves if leaf in values and held.get(leaf) != values[leaf])
            if changed:
                r = gnmi_pb2.SubscribeResponse()
                fill(r.update, name, ts, values, changed)
                out.append(r)
                held.update((leaf, values[leaf]) for leaf in changed)
        return out

    async def run(self, version: int, queue: asyncio.Queue) -> None:
        while True:
            await self.watch.wait(version, RESCAN_S)
            version = self.watch.version
            batch = self.diff(await self.current())
            if batch:
                await queue.put(batch)
