#!/usr/bin/env python3
"""Make a prebuilt llama.cpp (the ``llama-cpp-py-sync`` wheel's libraries) load on glibc 2.36.

The wheel's ``libllama.so`` and ``libggml-*.so`` were linked against glibc 2.38 and need only
its C23 parsers (``__isoc23_strtol``, ``__isoc23_sscanf``, ...): glibc 2.38 renamed ``strtol``
and ``sscanf`` for C23, whose only change is that they also read ``0b`` binary literals. On
glibc 2.36 the loader refuses the libraries (``version `GLIBC_2.38' not found``). This tool,
run once on a dev-only venv (never on sf_trt's own dependencies)::

    /work/venvs/peerenv/bin/python tools/llama_cpp_glibc.py patch [--lib-dir DIR]

1. marks each library's version requirements that this glibc lacks as weak (the ``vna_flags``
   bit ``VER_FLG_WEAK`` of its ``.gnu.version_r`` entries, a flag the loader honours: a weak
   version that is not found is no error), rewriting the files in place;
2. writes and compiles (``cc``) ``libglibc_compat.so`` into the same folder, whose
   ``__isoc23_*`` functions call the glibc 2.36 ones (``strtol``, ``vsscanf``, ...). A library
   needing a symbol of a newer glibc that the shim does not know is refused, by name.

Then, before the libraries are opened::

    import llama_cpp_glibc; llama_cpp_glibc.preload(lib_dir)   # the shim, RTLD_GLOBAL

llama-cpp-python (whose ``Llama`` and ``LlamaPromptLookupDecoding`` tools/bench_peers.py
drives) can run on these libraries instead of building its own (``CMAKE_ARGS=-DLLAMA_BUILD=OFF``,
then ``LLAMA_CPP_LIB_PATH`` names this folder), but its ctypes structs follow the llama.h it
vendors, and a struct passed by value must match the library's to the byte. ``bindings``
compares each ctypes struct of ``llama_cpp.llama_cpp`` that crosses by value (``BY_VALUE``) with the struct of the same name in the
library's own header (the wheel's cffi declarations), and inserts each field the library has
and the ctypes struct lacks into the installed ``llama_cpp/llama_cpp.py``, after the field it
follows there (llama-cpp-python 0.3.36 on the wheel's llama.cpp 0ce8cd1: ``moe_cache_size`` in
``llama_context_params``, two counters in ``llama_perf_context_data``). A field that is
renamed, removed or of a type it cannot map is refused, by name.

``--lib-dir`` defaults to the installed ``llama_cpp_py_sync`` package's folder. ``check``
reports what ``patch`` and ``bindings`` would do, changing nothing. Exit status: 0 done, 2
nothing to patch or a prerequisite missing, 1 a symbol the shim or a field the bindings
cannot take.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import platform
import re
import struct
import subprocess
import sys
from pathlib import Path

SHIM_NAME = "libglibc_compat.so"
VER_FLG_WEAK = 0x2
SHT_DYNSYM, SHT_GNU_VERNEED, SHT_GNU_VERSYM = 11, 0x6FFFFFFE, 0x6FFFFFFF

# the shim's functions: the C23 names glibc 2.38 added, each calling the older function of the
# same meaning (what differs, reading "0b..." as binary, llama.cpp's parsers never rely on)
SHIMS = {
    "__isoc23_strtol": "long __isoc23_strtol(const char *s, char **e, int b) { return strtol(s, e, b); }",
    "__isoc23_strtoul": "unsigned long __isoc23_strtoul(const char *s, char **e, int b) { return strtoul(s, e, b); }",
    "__isoc23_strtoll": "long long __isoc23_strtoll(const char *s, char **e, int b) { return strtoll(s, e, b); }",
    "__isoc23_strtoull": "unsigned long long __isoc23_strtoull(const char *s, char **e, int b) { return strtoull(s, e, b); }",
    "__isoc23_sscanf": ("int __isoc23_sscanf(const char *s, const char *f, ...) "
                        "{ va_list a; va_start(a, f); int r = vsscanf(s, f, a); va_end(a); return r; }"),
    "__isoc23_vsscanf": "int __isoc23_vsscanf(const char *s, const char *f, va_list a) { return vsscanf(s, f, a); }",
    "__isoc23_fscanf": ("int __isoc23_fscanf(FILE *s, const char *f, ...) "
                        "{ va_list a; va_start(a, f); int r = vfscanf(s, f, a); va_end(a); return r; }"),
}


def glibc_version() -> tuple[int, ...]:
    name, version = platform.libc_ver()
    if name != "glibc":
        raise SystemExit(f"llama_cpp_glibc: this C library is {name or 'unknown'!r}, expected glibc")
    return tuple(int(x) for x in version.split("."))


def _version_tuple(name: str) -> tuple[int, ...] | None:
    if not name.startswith("GLIBC_"):
        return None
    try:
        return tuple(int(x) for x in name[len("GLIBC_"):].split("."))
    except ValueError:
        return None


class Elf:
    """The few parts of an ELF64 little-endian shared library this tool reads and writes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = bytearray(path.read_bytes())
        if self.data[:4] != b"\x7fELF" or self.data[4] != 2 or self.data[5] != 1:
            raise ValueError(f"{path}: not an ELF64 little-endian file")
        shoff, = struct.unpack_from("<Q", self.data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", self.data, 0x3A)
        self.sections = []
        for i in range(shnum):
            (_name, stype, _flags, _addr, offset, size, link, info, _align, entsize) = struct.unpack_from(
                "<IIQQQQIIQQ", self.data, shoff + i * shentsize)
            self.sections.append(dict(type=stype, offset=offset, size=size, link=link, info=info, entsize=entsize))

    def _section(self, stype: int) -> dict | None:
        return next((s for s in self.sections if s["type"] == stype), None)

    def _str(self, strtab: dict, off: int) -> str:
        start = strtab["offset"] + off
        return bytes(self.data[start:self.data.index(0, start)]).decode()

    def needed_versions(self) -> list[tuple[str, str, int, int]]:
        """(library, version name, index, offset of the vernaux entry) of each version requirement."""
        vn = self._section(SHT_GNU_VERNEED)
        if vn is None:
            return []
        strtab = self.sections[vn["link"]]
        out, off = [], vn["offset"]
        for _ in range(vn["info"]):
            _ver, cnt, file_off, aux, nxt = struct.unpack_from("<HHIII", self.data, off)
            lib = self._str(strtab, file_off)
            a = off + aux
            for _ in range(cnt):
                _hash, _flags, other, name_off, anext = struct.unpack_from("<IHHII", self.data, a)
                out.append((lib, self._str(strtab, name_off), other, a))
                a += anext
            off += nxt
        return out

    def symbols_of_version(self, index: int) -> list[str]:
        """The undefined dynamic symbols that name version ``index``."""
        dynsym, versym = self._section(SHT_DYNSYM), self._section(SHT_GNU_VERSYM)
        if dynsym is None or versym is None:
            return []
        strtab = self.sections[dynsym["link"]]
        names = []
        for i in range(dynsym["size"] // dynsym["entsize"]):
            st_name, _info, _other, shndx = struct.unpack_from("<IBBH", self.data, dynsym["offset"] + i * dynsym["entsize"])
            ver, = struct.unpack_from("<H", self.data, versym["offset"] + 2 * i)
            if shndx == 0 and (ver & 0x7FFF) == index:
                names.append(self._str(strtab, st_name))
        return names

    def weaken(self, aux_offset: int) -> bool:
        """Set VER_FLG_WEAK on one vernaux entry; False if it was already set."""
        flags, = struct.unpack_from("<H", self.data, aux_offset + 4)
        if flags & VER_FLG_WEAK:
            return False
        struct.pack_into("<H", self.data, aux_offset + 4, flags | VER_FLG_WEAK)
        return True


def too_new(lib_dir: Path) -> dict[Path, list[tuple[str, int, list[str]]]]:
    """Each library in ``lib_dir`` with the glibc versions it needs that this glibc lacks:
    (version, vernaux offset, the symbols it binds to that version)."""
    have = glibc_version()
    found: dict[Path, list[tuple[str, int, list[str]]]] = {}
    for path in sorted(lib_dir.iterdir()):
        if path.is_symlink() or not path.is_file() or ".so" not in path.name or path.name == SHIM_NAME:
            continue
        elf = Elf(path)
        for lib, name, index, aux in elf.needed_versions():
            v = _version_tuple(name)
            if lib.startswith("libc.so") and v is not None and v > have:
                found.setdefault(path, []).append((name, aux, elf.symbols_of_version(index)))
    return found


def shim_source(symbols: set[str]) -> str:
    return "\n".join(["#include <stdarg.h>", "#include <stdio.h>", "#include <stdlib.h>", ""]
                     + [SHIMS[s] for s in sorted(symbols)]) + "\n"


def patch(lib_dir: Path, *, dry_run: bool = False) -> int:
    found = too_new(lib_dir)
    shim = lib_dir / SHIM_NAME
    if not found:
        state = "already patched" if shim.is_file() else "nothing needs a newer glibc"
        print(f"llama_cpp_glibc: {lib_dir}: {state} (glibc {'.'.join(map(str, glibc_version()))})")
        return 0 if shim.is_file() else 2
    symbols = {s for entries in found.values() for _n, _a, syms in entries for s in syms}
    for path, entries in found.items():
        for name, _aux, syms in entries:
            print(f"llama_cpp_glibc: {path.name}: needs {name} for {', '.join(syms) or '(no symbol)'}")
    unknown = sorted(symbols - SHIMS.keys())
    if unknown:
        print(f"llama_cpp_glibc: no shim for {', '.join(unknown)} (known: {', '.join(sorted(SHIMS))})", file=sys.stderr)
        return 1
    if dry_run:
        return 0
    src = lib_dir / "glibc_compat.c"
    src.write_text(shim_source(set(SHIMS)))
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", "-o", str(shim), str(src)], check=True)
    for path, entries in found.items():
        elf = Elf(path)
        for _name, aux, _syms in entries:
            elf.weaken(aux)
        path.write_bytes(elf.data)
    print(f"llama_cpp_glibc: patched {len(found)} libraries in {lib_dir}; shim {shim}")
    return 0


def default_lib_dir() -> Path:
    spec = importlib.util.find_spec("llama_cpp_py_sync")
    if spec is None or spec.origin is None:
        raise SystemExit("llama_cpp_glibc: llama_cpp_py_sync is not installed here (pip install llama-cpp-py-sync), "
                         "or pass --lib-dir")
    return Path(spec.origin).parent


def preload(lib_dir: Path | None = None) -> ctypes.CDLL | None:
    """Open the shim with RTLD_GLOBAL so the patched libraries find the ``__isoc23_*`` names;
    None where ``lib_dir`` has no shim (a build that needs none)."""
    shim = (lib_dir or default_lib_dir()) / SHIM_NAME
    return ctypes.CDLL(str(shim), mode=ctypes.RTLD_GLOBAL) if shim.is_file() else None


# C field types of llama.h's structs -> the ctypes spelling inserted into llama_cpp.py
CTYPES = {"size_t": "ctypes.c_size_t", "int32_t": "ctypes.c_int32", "uint32_t": "ctypes.c_uint32",
          "int64_t": "ctypes.c_int64", "uint64_t": "ctypes.c_uint64", "bool": "ctypes.c_bool",
          "float": "ctypes.c_float", "double": "ctypes.c_double"}


def header_structs(cdef: str) -> dict[str, list[tuple[str, str]]]:
    """Each ``struct NAME { ... }`` of a C header text: [(field, C type)]."""
    cdef = re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", cdef), flags=re.S)
    out = {}
    for m in re.finditer(r"struct (\w+)\s*\{(.*?)\}", cdef, flags=re.S):
        fields = []
        for decl in m.group(2).split(";"):
            decl = " ".join(decl.split())
            fm = re.match(r"(.*?)[\s*]*(\w+)(\[\w+\])?$", decl)
            if decl and fm:
                fields.append((fm.group(2), fm.group(1).strip() + (" *" if "*" in decl else "")))
        out[m.group(1)] = fields
    return out


# the structs llama-cpp-python passes or returns by value, or fills in place (the rest are opaque
# or reached through pointers the library itself allocates)
BY_VALUE = ("llama_model_params", "llama_context_params", "llama_model_quantize_params", "llama_batch",
            "llama_perf_context_data", "llama_perf_sampler_data", "llama_sampler_chain_params",
            "llama_token_data", "llama_token_data_array", "llama_logit_bias", "llama_chat_message")


def binding_fixes(source: str, header: dict[str, list[tuple[str, str]]]) -> tuple[list[tuple[str, str, str, str]], list[str]]:
    """(struct, field, C type, field it follows) to insert into llama_cpp.py's ctypes structs, and
    the differences that cannot be mended by an insertion."""
    fixes, refused = [], []
    for m in re.finditer(r"class (\w+)\(ctypes\.(?:Structure|Union)\):.*?_fields_ = \[(.*?)\n    \]", source, flags=re.S):
        name, ours = m.group(1), re.findall(r'\("(\w+)",', m.group(2))
        theirs = header.get(name)
        if name not in BY_VALUE or theirs is None or [f for f, _ in theirs] == ours:
            continue
        names = [f for f, _ in theirs]
        if [f for f in names if f in ours] != ours:
            refused.append(f"{name}: fields {ours} are not an in-order subset of the library's {names}")
            continue
        for i, (field, ctype) in enumerate(theirs):
            if field in ours:
                continue
            if i == 0 or ctype not in CTYPES:
                refused.append(f"{name}.{field}: type {ctype!r} (or first field) is not one this tool inserts")
                continue
            fixes.append((name, field, ctype, names[i - 1]))
    return fixes, refused


def bindings(*, dry_run: bool = False) -> int:
    try:
        from llama_cpp_py_sync import _cffi_bindings
    except ImportError as e:
        print(f"llama_cpp_glibc: bindings needs llama_cpp_py_sync importable: {e}", file=sys.stderr)
        return 2
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        print("llama_cpp_glibc: bindings needs llama-cpp-python installed (llama_cpp)", file=sys.stderr)
        return 2
    target = Path(spec.origin).parent / "llama_cpp.py"
    source = target.read_text()
    fixes, refused = binding_fixes(source, header_structs(_cffi_bindings._LLAMA_H_CDEF))
    for r in refused:
        print(f"llama_cpp_glibc: cannot align {r}", file=sys.stderr)
    if refused:
        return 1
    if not fixes:
        print(f"llama_cpp_glibc: {target}: every ctypes struct matches the library's")
        return 0
    for struct_name, field, ctype, after in fixes:
        print(f"llama_cpp_glibc: {struct_name}: insert {field} ({ctype}) after {after}")
        if dry_run:
            continue
        m = re.search(rf"class {struct_name}\(ctypes\.(?:Structure|Union)\):.*?\n(\s*)\(\"{after}\", [^\n]*\n", source, flags=re.S)
        line = f'{m.group(1)}("{field}", {CTYPES[ctype]}),  # added by tools/llama_cpp_glibc.py bindings\n'
        source = source[:m.end()] + line + source[m.end():]
    if not dry_run:
        target.write_text(source)
        print(f"llama_cpp_glibc: aligned {len(fixes)} fields in {target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("patch", "bindings", "check"))
    p.add_argument("--lib-dir", type=Path, help="the folder of libllama.so (default: llama_cpp_py_sync's)")
    args = p.parse_args(argv)
    lib_dir = args.lib_dir or default_lib_dir()
    if not lib_dir.is_dir():
        print(f"llama_cpp_glibc: --lib-dir {lib_dir}: not a folder", file=sys.stderr)
        return 2
    if args.action == "bindings":
        return bindings()
    rc = patch(lib_dir, dry_run=args.action == "check")
    return bindings(dry_run=True) if args.action == "check" and rc == 0 else rc


if __name__ == "__main__":
    sys.exit(main())
