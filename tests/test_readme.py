"""The README's Python example runs as written, and its commands match the command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def section(title: str, text: str = README) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end > 0 else None]


@pytest.mark.slow
def test_the_python_example_runs_the_real_model_and_prints_what_it_promises(tmp_path, real_int8_model_dir):
    (code,) = re.findall(r"```python\n(.*?)```", section("Using it from Python"), re.S)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    first, rest = proc.stdout.split("\n", 1)
    text, reason, count = re.fullmatch(r"('.+') (stop|length) (\d+)", first).groups()
    assert eval(text).strip() and (reason == "stop" or int(count) == 24)
    assert rest.strip()  # the chat reply and the streamed text


def test_the_executor_example_runs_and_prints_what_it_promises(tmp_path):
    (code,) = re.findall(r"```python\n(.*?)```", section("The contract", (ROOT / "docs" / "design.md").read_text()), re.S)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    tokens, finish, proposed, accepted = re.fullmatch(r"(\[.*\]) (\S+) (\d+) (\d+)\n", proc.stdout).groups()
    assert len(eval(tokens)) == 16 and finish in ("Finish.NONE", "0")
    assert int(proposed) >= int(accepted) > 0  # the prompt repeats itself: drafts are taken


def test_the_two_setup_commands_are_there():
    commands = re.findall(r"```sh\n(.*?)```", section("Two commands"), re.S)
    assert [c.strip() for c in commands] == [
        'pip install -e \'.[test]\' && sf-trt generate --chat "Rewrite this function with type hints: def add(a, b): return a + b"',
        "pip install -e '.[test,ray]' && pytest",
    ]
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert "pip install -q -e '.[test,ray]'" in ci and "\npytest" in ci
