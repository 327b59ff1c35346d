"""The README's Python example runs as written, and its commands match the command line."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start: end if end > 0 else None]


def test_the_python_example_runs_and_prints_what_it_promises(tmp_path):
    (code,) = re.findall(r"```python\n(.*?)```", section("Using it from Python"), re.S)
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
