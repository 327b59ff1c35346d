"""The README's serving examples (curl and the openai client) run as written against a
live server (the fake backend on a free port instead of the model on port 8000)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
SECTION = README[README.index("## Serving\n"): README.index("\n## ", README.index("## Serving\n") + 1)]


def test_the_curl_example_gets_an_answer(fake_server):
    (sh,) = re.findall(r"```sh\n(.*?)```", SECTION, re.S)
    curl = sh.split("\n", 1)[1].replace("\\\n", " ").replace("http://127.0.0.1:8000", fake_server.url)
    words = shlex.split(curl)
    assert words[:2] == ["curl", "-s"]
    body = words[words.index("-d") + 1]
    resp = httpx.post(words[2], content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] > 0


def test_the_openai_example_streams_an_answer(fake_server, tmp_path):
    (code,) = re.findall(r"```python\n(.*?)```", SECTION, re.S)
    code = code.replace("http://127.0.0.1:8000", fake_server.url)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout  # the streamed text
