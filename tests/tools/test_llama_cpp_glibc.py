"""tools/llama_cpp_glibc.py on a real shared library compiled here: the version requirements it
reads, the weak flag it sets, the symbols it refuses; and its ctypes-struct alignment on text."""

from __future__ import annotations

import shutil
import subprocess

import pytest

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


@pytest.fixture
def lib(tmp_path):
    """A shared library that calls strtol (glibc's GLIBC_2.2.5 on x86_64) and sscanf."""
    src = tmp_path / "uses.c"
    src.write_text("#include <stdlib.h>\n#include <stdio.h>\n"
                   "long f(const char *s) { int x = 0; sscanf(s, \"%d\", &x); return strtol(s, 0, 10) + x; }\n")
    out = tmp_path / "libs" / "libuses.so"
    out.parent.mkdir()
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True)
    return out


def test_it_reads_the_glibc_versions_a_library_needs_and_the_symbols_bound_to_them(load_tool, lib):
    glibc = load_tool("llama_cpp_glibc")
    needed = glibc.Elf(lib).needed_versions()
    libc = [(name, index) for soname, name, index, _aux in needed if soname.startswith("libc.so")]
    assert libc, f"expected a libc version requirement, got {needed}"
    symbols = {s for _name, index in libc for s in glibc.Elf(lib).symbols_of_version(index)}
    assert "strtol" in symbols


def test_versions_this_glibc_has_are_left_alone(load_tool, lib):
    glibc = load_tool("llama_cpp_glibc")
    assert glibc.too_new(lib.parent) == {}
    assert glibc.patch(lib.parent) == 2  # nothing to patch, no shim written
    assert not (lib.parent / glibc.SHIM_NAME).exists()


def test_a_symbol_the_shim_does_not_know_is_refused_by_name_and_nothing_is_changed(load_tool, lib, monkeypatch, capsys):
    glibc = load_tool("llama_cpp_glibc")
    before = lib.read_bytes()
    monkeypatch.setattr(glibc, "glibc_version", lambda: (2, 1))  # as if every GLIBC_2.x it needs were newer
    found = glibc.too_new(lib.parent)
    assert lib in found and any("strtol" in syms for _n, _a, syms in found[lib])
    assert glibc.patch(lib.parent) == 1
    err = capsys.readouterr().err
    assert "no shim for" in err and "strtol" in err
    assert lib.read_bytes() == before and not (lib.parent / glibc.SHIM_NAME).exists()


def test_weaken_sets_only_the_weak_flag_of_that_entry_and_once(load_tool, lib):
    glibc = load_tool("llama_cpp_glibc")
    elf = glibc.Elf(lib)
    _soname, _name, _index, aux = next(e for e in elf.needed_versions() if e[0].startswith("libc.so"))
    before = bytes(elf.data)
    assert elf.weaken(aux) is True and elf.weaken(aux) is False
    changed = [i for i, (a, b) in enumerate(zip(before, elf.data)) if a != b]
    assert changed == [aux + 4]  # vna_flags' low byte
    assert elf.data[aux + 4] & glibc.VER_FLG_WEAK


def test_the_shim_compiles_and_calls_the_older_functions(load_tool, tmp_path):
    import ctypes

    glibc = load_tool("llama_cpp_glibc")
    src = tmp_path / "shim.c"
    src.write_text(glibc.shim_source(set(glibc.SHIMS)))
    out = tmp_path / glibc.SHIM_NAME
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    shim = ctypes.CDLL(str(out))
    shim.__isoc23_strtol.restype = ctypes.c_long
    assert shim.__isoc23_strtol(b"-42x", None, 10) == -42
    x = ctypes.c_int()
    assert shim.__isoc23_sscanf(b"7 8", b"%d", ctypes.byref(x)) == 1 and x.value == 7


CTYPES_SOURCE = '''
class llama_context_params(ctypes.Structure):
    _fields_ = [
        ("n_ctx", ctypes.c_uint32),
        ("type_v", ctypes.c_int),
        ("abort_callback", ggml_abort_callback),
    ]

class llama_other(ctypes.Structure):
    _fields_ = [
        ("a", ctypes.c_int),
    ]
'''

HEADER = """
typedef struct llama_context_params {
    uint32_t n_ctx;        // comment
    enum ggml_type type_v;
    size_t moe_cache_size; /* new */
    ggml_abort_callback abort_callback;
} llama_context_params;
struct llama_other { int b; };
"""


def test_bindings_insert_a_field_the_library_has_after_the_one_it_follows(load_tool):
    glibc = load_tool("llama_cpp_glibc")
    fixes, refused = glibc.binding_fixes(CTYPES_SOURCE, glibc.header_structs(HEADER))
    assert refused == []  # llama_other is not passed by value: not compared
    assert fixes == [("llama_context_params", "moe_cache_size", "size_t", "type_v")]


def test_bindings_refuse_a_renamed_field_by_name(load_tool):
    glibc = load_tool("llama_cpp_glibc")
    header = HEADER.replace("uint32_t n_ctx;", "uint32_t n_ctx_total;")
    fixes, refused = glibc.binding_fixes(CTYPES_SOURCE, glibc.header_structs(header))
    assert fixes == [] and len(refused) == 1 and "llama_context_params" in refused[0] and "n_ctx_total" in refused[0]
