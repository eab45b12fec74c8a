"""PEP 517 build backend of w4a16-moe: scikit-build-core, plus an honest platform tag for AOT wheels.

scikit-build-core tags a platform wheel ``linux_x86_64`` (installable nowhere through an index). After it
builds one, :func:`retag_wheel` reads every ELF shared object inside, takes the newest ``GLIBC_x.y`` symbol
version any of them requires (the real minimum glibc) and renames the wheel to ``manylinux_2_<y>_<arch>``,
raising the tag further if a library needs a newer libstdc++ (``GLIBCXX_``) than the baseline distribution
of that glibc ships (:data:`GLIBCXX_BASELINE`). The WHEEL metadata and RECORD are rewritten to match. A
pure-Python wheel (no AOT kernels) passes through untouched.

Self-contained on purpose (it runs before the package is importable); the ELF reading is the subset of
the format needed for ``.gnu.version_r`` (required symbol versions).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import struct
import zipfile
from pathlib import Path

from scikit_build_core.build import *  # noqa: F401,F403  (build_sdist, get_requires_for_build_*, prepare_*)
from scikit_build_core.build import build_wheel as _skbuild_build_wheel

SHT_GNU_VERNEED = 0x6FFFFFFE

#: newest libstdc++ symbol version of the reference distribution of each manylinux glibc level:
#: 2.28 RHEL 8 (GCC 8), 2.31 Ubuntu 20.04 (GCC 10), 2.34 RHEL 9 (GCC 11), 2.35 Ubuntu 22.04 (GCC 12),
#: 2.39 Ubuntu 24.04 (GCC 14)
GLIBCXX_BASELINE = {28: (3, 4, 25), 31: (3, 4, 28), 34: (3, 4, 29), 35: (3, 4, 30), 39: (3, 4, 33)}


def required_versions(data: bytes) -> set:
    """Symbol version names (``GLIBC_2.34``, ``GLIBCXX_3.4.26``...) an ELF64 little-endian shared object
    requires, read from its ``.gnu.version_r`` section; empty for anything else."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return set()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = set()
    for _name, typ, _fl, _addr, off, _size, link, info, _al, _es in secs:
        if typ != SHT_GNU_VERNEED:
            continue
        stroff = secs[link][4]
        pos = off
        for _ in range(info):  # sh_info = number of Verneed entries
            _ver, cnt, _file, aux, nxt = struct.unpack_from("<HHIII", data, pos)
            apos = pos + aux
            for _ in range(cnt):
                _hash, _flags, _other, name, anext = struct.unpack_from("<IHHII", data, apos)
                end = data.index(b"\0", stroff + name)
                out.add(data[stroff + name : end].decode())
                apos += anext
            pos += nxt
    return out


def _max_version(names, prefix: str) -> tuple:
    vs = [tuple(int(x) for x in n[len(prefix):].split(".")) for n in names if re.fullmatch(re.escape(prefix) + r"[\d.]+", n)]
    return max(vs) if vs else ()


def manylinux_level(files: dict) -> tuple:
    """``(glibc minor, report)`` for ``{name: ELF bytes}``: the manylinux_2_<minor> level these libraries need."""
    glibc, glibcxx, report = (2, 17), (), {}
    for name, data in files.items():
        req = required_versions(data)
        g, gx = _max_version(req, "GLIBC_"), _max_version(req, "GLIBCXX_")
        report[name] = {"glibc": ".".join(map(str, g)) or None, "glibcxx": ".".join(map(str, gx)) or None}
        glibc = max(glibc, g or glibc)
        glibcxx = max(glibcxx, gx)
    minor = glibc[1]
    if glibcxx:
        ok = [m for m, base in sorted(GLIBCXX_BASELINE.items()) if base >= glibcxx]
        if not ok:
            raise RuntimeError(f"a library needs libstdc++ GLIBCXX_{'.'.join(map(str, glibcxx))}, newer than any "
                               f"manylinux baseline known here ({GLIBCXX_BASELINE}); build with an older compiler")
        minor = max(minor, ok[0])
    return minor, report


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def retag_wheel(path) -> str:
    """Retag the platform wheel at ``path`` as manylinux (see the module docstring); returns the new file name
    (the old file is replaced). Wheels without shared objects or not tagged ``linux_*`` are left alone."""
    path = Path(path)
    m = re.fullmatch(r"(?P<stem>.+?-[^-]+)-(?P<py>[^-]+)-(?P<abi>[^-]+)-linux_(?P<arch>[a-z0-9_]+)\.whl", path.name)
    if not m:
        return path.name
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        blobs = {i.filename: z.read(i.filename) for i in infos}
    elfs = {n: b for n, b in blobs.items() if n.endswith(".so") or ".so." in n}
    elfs = {n: b for n, b in elfs.items() if b[:4] == b"\x7fELF"}
    if not elfs:
        return path.name
    minor, _ = manylinux_level(elfs)
    plat = f"manylinux_2_{minor}_{m['arch']}"
    tag = f"{m['py']}-{m['abi']}-{plat}"
    wheel_file = next(n for n in blobs if n.endswith(".dist-info/WHEEL"))
    record_file = next(n for n in blobs if n.endswith(".dist-info/RECORD"))
    lines = [ln for ln in blobs[wheel_file].decode().splitlines() if not ln.startswith("Tag:")]
    lines.append(f"Tag: {tag}")
    blobs[wheel_file] = ("\n".join(lines) + "\n").encode()
    rows = list(csv.reader(io.StringIO(blobs[record_file].decode())))
    for r in rows:
        if r and r[0] == wheel_file:
            r[1], r[2] = _record_hash(blobs[wheel_file]), str(len(blobs[wheel_file]))
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    blobs[record_file] = buf.getvalue().encode()
    new = path.with_name(f"{m['stem']}-{tag}.whl")
    tmp = new.with_name(new.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for i in infos:
            zi = zipfile.ZipInfo(i.filename, date_time=i.date_time)
            zi.external_attr, zi.compress_type = i.external_attr, zipfile.ZIP_DEFLATED
            z.writestr(zi, blobs[i.filename])
    os.replace(tmp, new)
    if new != path:
        path.unlink()
    return new.name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = _skbuild_build_wheel(wheel_directory, config_settings, metadata_directory)
    return retag_wheel(Path(wheel_directory) / name)
