"""List tables for an 80-column terminal that never cut an identifier.

Each column is an identifier or state (one line, whole: a kind, an element, an id, a host), or free
text that may wrap at spaces (a name, a summary, a message; a list of ids joined by ", " wraps between
them). The default view shows times relative ("3m ago") and a short severity; when the terminal is too
narrow it leaves out the columns marked `drop` (highest first) and wraps the free text, and if even
then the identifiers do not fit it prints wider than the terminal rather than cut them. `--wide`
shows every column in full.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

WIDE_WRAP = 60  # --wide: free-text columns wrap at this width, not the terminal's
WideOpt: bool = typer.Option(False, "--wide", "-w", help=(
    "every column in full, times absolute (the default fits 80 columns: relative times, short severity)"))
SEVERITY_SHORT = {"critical": "crit", "warning": "warn"}  # major, minor: short already


def ago(ns: int | None, now_ns: int | None = None, never: str = "never") -> str:
    """A time relative to now: '3m ago', 'in 5m' (the future), `never` for none."""
    if not ns:
        return never
    s = ((now_ns or time.time_ns()) - ns) / 1e9
    text = next((f"{abs(s) / scale:.0f}{unit}" for unit, scale in (("d", 86400), ("h", 3600), ("m", 60))
                 if abs(s) >= scale), f"{abs(s):.0f}s")
    return f"{text} ago" if s >= 0 else f"in {text}"


def severity(value: str, styles: dict[str, str], wide: bool = False) -> str:
    text = value if wide else SEVERITY_SHORT.get(value, value)
    style = styles.get(value)
    return f"[{style}]{text}[/]" if style else text


@dataclass
class Col:
    header: str
    wrap: bool = False  # free text, may wrap at spaces; never an identifier's only column
    drop: int = 0  # default view, narrow terminal: left out, highest first (0: always shown)
    justify: str = "left"


class ListTable:
    """Columns (Col or a header: an identifier column), rows of rich markup strings; print() fits them."""

    def __init__(self, *columns: Col | str, **table_kwargs) -> None:
        self.columns = [c if isinstance(c, Col) else Col(c) for c in columns]
        self.rows: list[tuple[str, ...]] = []
        self.table_kwargs = table_kwargs

    def add_row(self, *cells: str) -> None:
        assert len(cells) == len(self.columns)
        self.rows.append(cells)

    def _sizes(self, console: Console) -> list[tuple[int, int]]:
        """(narrowest, widest) each column's content can be without cutting a word."""
        sizes = []
        for i, col in enumerate(self.columns):
            texts = [col.header] + [console.render_str(r[i], highlight=False).plain for r in self.rows]
            widest = max(cell_len(line) for t in texts for line in (t.split("\n") or [""]))
            narrowest = max((cell_len(w) for t in texts for w in t.split()), default=0) if col.wrap else widest
            sizes.append((narrowest, widest))
        return sizes

    def print(self, console: Console, wide: bool = False, err_console: Console | None = None) -> None:
        sizes = self._sizes(console)
        shown = list(range(len(self.columns)))
        chrome = lambda n: 3 * n + 1  # noqa: E731  (the default box: a bar and a space either side)
        widths: dict[int, int] = {}
        if wide:
            need = sum(min(sizes[i][1], WIDE_WRAP) if self.columns[i].wrap else sizes[i][1] for i in shown)
        else:
            least = lambda: sum(sizes[i][0] for i in shown) + chrome(len(shown))  # noqa: E731
            while least() > console.width and any(self.columns[i].drop for i in shown):
                shown.remove(max((i for i in shown if self.columns[i].drop),
                                 key=lambda i: (self.columns[i].drop, i)))
            need = max(console.width, least()) - chrome(len(shown))
            if sum(sizes[i][1] for i in shown) > need:
                widths = self._share(sizes, shown, need)
        table = Table(**self.table_kwargs)
        for i in shown:
            col = self.columns[i]
            table.add_column(col.header, justify=col.justify, no_wrap=not col.wrap, overflow="fold",
                             width=widths.get(i), max_width=WIDE_WRAP if wide and col.wrap else None)
        for r in self.rows:
            table.add_row(*(r[i] for i in shown))
        need += chrome(len(shown))
        if need <= console.width:  # (the default view: it fits, free text wrapped to make it so)
            console.print(table)
        else:  # never cut: as wide as the identifiers need (pipe to `less -S`)
            Console(file=console.file, width=need, soft_wrap=True, force_terminal=console.is_terminal,
                    color_system=console.color_system).print(table)
        left_out = [self.columns[i].header for i in range(len(self.columns)) if i not in shown]
        if left_out and err_console is not None:
            err_console.print(f"[dim]not shown at {console.width} columns: {', '.join(left_out)} (--wide)[/]")

    def _share(self, sizes: list[tuple[int, int]], shown: list[int], width: int) -> dict[int, int]:
        """Widths for the free-text columns: each at least its longest word, the rest shared out."""
        wrap = [i for i in shown if self.columns[i].wrap]
        spare = width - sum(sizes[i][1] for i in shown if i not in wrap)
        widths = {i: sizes[i][0] for i in wrap}
        spare -= sum(widths.values())
        while spare > 0:
            growable = [i for i in wrap if widths[i] < sizes[i][1]]
            if not growable:
                break
            widths[min(growable, key=lambda i: widths[i])] += 1
            spare -= 1
        return widths
