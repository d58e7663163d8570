"""Slack incoming webhook (kind `slack`): `text` (fallback, notifications) and Block Kit blocks.

The webhook URL itself is the credential (hooks.slack.com/services/T…/B…/secret): its path is
never shown or logged (`public_url` keeps only scheme and host).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from nms.app.notify.base import HttpRequest, Sink, iso_utc, truncate
from nms.records import IncidentEvent

ICON = {"opened": ":red_circle:", "updated": ":large_orange_circle:", "acknowledged": ":eyes:",
        "resolved": ":large_green_circle:"}


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _ids(ids: list[int]) -> str:
    return " ".join(f"#{i}" for i in ids[:20]) + (f" (+{len(ids) - 20} more)" if len(ids) > 20 else "")


class SlackSink(Sink):
    kind = "slack"

    def render(self, event: IncidentEvent, delivery_id: int, now_ns: int) -> HttpRequest:
        inc = event.incident
        state = event.event.upper()
        head = f"{state}: {inc.kind} ({inc.severity})"
        text = f"[{self.site}] {state} {inc.severity} {inc.kind} on {inc.element}: {inc.summary}"
        if event.event == "resolved":
            text = f"[{self.site}] RESOLVED: {inc.kind} on {inc.element} is resolved ({inc.summary})"
        fields = [f"*Element*\n`{_esc(inc.element)}`", f"*Site*\n{_esc(self.site)}",
                  f"*Severity*\n{inc.severity}", f"*Incident*\n#{inc.id}",
                  f"*Opened*\n{iso_utc(inc.opened_ns)}"]
        if inc.resolved_ns is not None:
            fields.append(f"*Resolved*\n{iso_utc(inc.resolved_ns)}")
        if inc.acknowledged_by:
            fields.append(f"*Acknowledged by*\n{_esc(inc.acknowledged_by)}")
        if inc.children:
            fields.append(f"*Explains*\n{_ids(inc.children)}")
        if event.absorbed:
            fields.append(f"*Absorbed*\n{_ids(event.absorbed)} (notified before; now under #{inc.id})")
        jobs = ", ".join(inc.jobs[:20]) + (f" (+{len(inc.jobs) - 20} more)" if len(inc.jobs) > 20 else "")
        blocks = [
            {"type": "header", "text": {"type": "plain_text", "text": truncate(f"{ICON[event.event]} {head}", 150),
                                        "emoji": True}},
            {"type": "section", "text": {"type": "mrkdwn", "text": truncate(_esc(inc.summary) or "-", 3000)}},
            {"type": "section", "fields": [{"type": "mrkdwn", "text": truncate(f, 2000)} for f in fields[:10]]},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": truncate(
                f"Jobs: {_esc(jobs) or 'none'} · paths affected: {len(inc.paths)}", 3000)}]},
        ]
        return self.post({"text": truncate(text, 3000), "blocks": blocks})

    def secrets(self) -> list[str]:
        path = urlsplit(self.config.url).path
        return super().secrets() + ([path, path.rsplit("/", 1)[-1]] if len(path) > 1 else [])

    def public_url(self) -> str:
        parts = urlsplit(super().public_url())
        return f"{parts.scheme}://{parts.netloc}/…" if len(parts.path) > 1 else f"{parts.scheme}://{parts.netloc}"
