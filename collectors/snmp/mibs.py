"""Extra SNMP objects by name: `MIB-NAME::object[.index]` resolved to a numeric OID.

MIB source files are read from the `mibs/` directory of the project and any configured
`polling.mib_dirs`, compiled once per process by pysmi (an optional dependency: `pip install
fabric-nms[mibs]`) into symbol tables, never at poll time. pysmi needs every imported module's
source too: vendor bundles normally include the IETF base modules (SNMPv2-SMI, SNMPv2-TC,
SNMPv2-CONF, ...) next to their own; put them all in the same directory. Numeric OIDs need none of
this.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path

PROJECT_MIBS = Path(__file__).resolve().parents[1] / "mibs"
_NAME_RE = re.compile(r"^([A-Za-z][\w-]*)::([A-Za-z][\w-]*)((?:\.\d+)*)$")
_lock = threading.Lock()
_modules: dict[tuple[str, tuple[str, ...]], dict[str, tuple[int, ...]]] = {}


def resolve(text: str, mib_dirs: Sequence[str | Path] | None = None) -> tuple[int, ...]:
    """'1.3.6.1.2.1.1.3.0' or 'SOME-MIB::object.0' -> (1, 3, 6, ...). Raises ValueError with the reason."""
    text = text.strip()
    if re.fullmatch(r"\.?\d+(\.\d+)+", text):
        return tuple(int(x) for x in text.strip(".").split("."))
    m = _NAME_RE.match(text)
    if not m:
        raise ValueError(f"extra OID {text!r}: give a numeric OID or MIB-NAME::object[.index]")
    module, name, index = m.groups()
    dirs = tuple(str(Path(d).resolve()) for d in [*(mib_dirs or []), PROJECT_MIBS])
    symbols = _load(module, dirs)
    if name not in symbols:
        raise ValueError(f"extra OID {text!r}: {module} defines no object {name!r}")
    return symbols[name] + tuple(int(x) for x in index.strip(".").split(".") if x)


def _load(module: str, dirs: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    key = (module, dirs)
    with _lock:
        if key not in _modules:
            _modules[key] = _compile(module, dirs)
        return _modules[key]


def _compile(module: str, dirs: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    try:
        from pysmi.codegen import JsonCodeGen
        from pysmi.compiler import MibCompiler
        from pysmi.parser import SmiStarParser
        from pysmi.reader import FileReader
        from pysmi.writer import CallbackWriter
    except ImportError:
        raise ValueError(f"resolving {module}::... needs pysmi (pip install 'fabric-nms[mibs]'); "
                         "numeric OIDs work without it") from None
    out: dict[str, str] = {}
    compiler = MibCompiler(SmiStarParser(), JsonCodeGen(),
                           CallbackWriter(lambda name, data, ctx: out.__setitem__(name, data)))
    existing = [d for d in dirs if Path(d).is_dir()]
    compiler.add_sources(*(FileReader(d) for d in existing))
    status = compiler.compile(module, genTexts=False)
    if module not in out:
        problems = {m: str(s) for m, s in status.items() if str(s) not in ("compiled", "untouched")}
        raise ValueError(f"cannot compile MIB module {module} from {', '.join(existing) or 'no MIB directory'}: "
                         f"{problems or status} (its imports must be there too)")
    symbols = json.loads(out[module])
    return {name: tuple(int(x) for x in sym["oid"].split("."))
            for name, sym in symbols.items() if isinstance(sym, dict) and "oid" in sym}
