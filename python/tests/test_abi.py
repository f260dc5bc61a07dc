"""The ctypes mirror matches the C headers: a C program compiled against the
headers prints every struct's size and field offsets and the error codes;
they must equal the package's. Catches a header change the package missed."""

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import xfer
from xfer import _lib, _node_lib

STRUCTS = {**_lib.STRUCTS, **_node_lib.STRUCTS}

ROOT = Path(os.environ.get("XFER_ROOT", Path(__file__).resolve().parents[2]))


CONSTS = ("TRANSPORT_TCP", "TRANSPORT_IPC", "TRANSPORT_RDMA", "TRANSPORT_TCPX", "MEM_HOST", "MEM_CUDA", "ACCESS_R",
          "ACCESS_W", "OP_READ", "OP_WRITE", "NAME_MAX", "BLOB_MAX", "NICS_MAX", "EINPROGRESS", "NOTIFY_MAX")


def c_program() -> str:
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "xfer_node.h"', "int main(void) {"]
    for cname, cls in STRUCTS.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
        for f, _ in cls._fields_:
            lines.append(f'printf("{cname}.{f} %zu\\n", offsetof({cname}, {f}));')
    for code in xfer.Code:
        lines.append(f'printf("XFER_{code.name} %d\\n", (int)XFER_{code.name});')
    for name in CONSTS:
        lines.append(f'printf("{name} %d\\n", (int)XFER_{name});')
    lines += ["return 0;", "}"]
    return "\n".join(lines)


def test_layouts_match_headers(tmp_path):
    cc = shutil.which("cc")
    if not cc or not (ROOT / "engine" / "xfer.h").exists():
        pytest.skip("needs cc and the source tree's headers")
    src = tmp_path / "abi.c"
    src.write_text(c_program())
    exe = tmp_path / "abi"
    subprocess.run([cc, f"-I{ROOT}/engine", f"-I{ROOT}/registry", f"-I{ROOT}/node", str(src), "-o", str(exe)], check=True)
    got = dict(line.rsplit(" ", 1) for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                              check=True).stdout.splitlines())
    bad = []
    for cname, cls in STRUCTS.items():
        if int(got[cname]) != ctypes.sizeof(cls):
            bad.append(f"sizeof {cname}: C {got[cname]} vs ctypes {ctypes.sizeof(cls)}")
        for f, _ in cls._fields_:
            off = getattr(cls, f).offset
            if int(got[f"{cname}.{f}"]) != off:
                bad.append(f"{cname}.{f}: C {got[cname + '.' + f]} vs ctypes {off}")
    for code in xfer.Code:
        if int(got[f"XFER_{code.name}"]) != code.value:
            bad.append(f"XFER_{code.name}: C {got['XFER_' + code.name]} vs {code.value}")
    for name in CONSTS:
        if int(got[name]) != getattr(_lib, name):
            bad.append(f"{name}: C {got[name]} vs {getattr(_lib, name)}")
    assert not bad, "\n".join(bad)
