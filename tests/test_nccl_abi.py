"""The plugin's ABI definitions (nccl_plugin/src/nccl_abi.h) against the layouts NVIDIA's headers
give (tests/nccl/abi_layout.txt, compiled from NVIDIA/nccl's profiler_v1..v6.h, net_ib_v1.h and
net_socket_v1.h): the size of every descriptor / argument / plugin struct, the offset of every
member the plugin reads or the driver writes."""

from __future__ import annotations

import platform
import subprocess

import pytest

from tests.nccl.harness import HERE

ABI_HEADER = HERE.parent.parent / "nccl_plugin" / "src" / "nccl_abi.h"

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the reference layout is x86-64's")


def _probe_program(fields: list[tuple[str, str]]) -> str:
    lines = [f'#include "{ABI_HEADER}"', "#include <stdio.h>", "int main(void) {"]
    for struct, member in fields:
        if member == "-":
            lines.append(f'  printf("{struct} - %zu\\n", sizeof({struct}));')
        else:
            offset = f"(size_t)((char*)&x.{member} - (char*)&x)"
            lines.append(f'  {{ {struct} x; printf("{struct} {member} %zu\\n", {offset}); }}')
    return "\n".join([*lines, "  return 0;", "}"])


def test_layouts_match_nvidias_headers(tmp_path):
    reference = [line.split() for line in (HERE / "abi_layout.txt").read_text().splitlines()
                 if line.strip() and not line.startswith("#")]
    fields = [(s, m) for s, m, _ in reference]
    want = {(s, m): int(v) for s, m, v in reference}
    assert len(want) > 150 and len({s for s, _ in fields}) == 16  # 6 descriptors, 2 args, 2 net, 6 plugins
    source = tmp_path / "probe.c"
    source.write_text(_probe_program(fields))
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", "-o", str(tmp_path / "probe"), str(source)], check=True)
    got = {}
    probe = subprocess.run([str(tmp_path / "probe")], capture_output=True, text=True, check=True)
    for line in probe.stdout.splitlines():
        s, m, v = line.split()
        got[(s, m)] = int(v)
    assert got == want
