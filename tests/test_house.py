"""The house: four layers across the folders, arrows that run one way, no circles.

    cli/                  sf_trt.cli          the command line: parses flags into the entry points' specs
    sf_trt/entrypoints/   sf_trt.entrypoints  open a model once and run it (sf_trt.LLM, ModelSpec); with
    sf_trt/__init__.py    sf_trt              the package's front door, which names them lazily
    export/               sf_trt.export       build steps: GGUF -> model directory -> engines; uses the runtime
    sf_trt/               sf_trt.*            the runtime: owns every format it reads; imports no layer above

Inside the runtime, :data:`INNER` orders its parts from the bottom up; a module may
import its own part and the parts below. :func:`violations` reads every import of
every file (lazy ones inside functions too) and names each arrow that runs up a
layer or up the inner order, and each circle of modules.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {"sf_trt": 0, "export": 1, "cli": 3}
"""Folder -> layer; a file may import modules of its own layer or below."""
ENTRY_LAYER = 2
ENTRY = ("sf_trt", "sf_trt.entrypoints")
"""The entry points' layer: the package ``sf_trt.entrypoints`` and the package module ``sf_trt``
itself (its ``__init__``: the front door that names ``sf_trt.LLM``)."""

INNER = (
    ("abi", "version"),
    ("formats", "tokenizer", "models"),
    ("graphs",),
    ("engine", "primitives", "outputs", "block_pool"),
    ("drafting", "strategies", "penalties", "grammar", "prefix_cache"),
    ("executor", "testing", "faults"),
    ("backends", "fake"),
    ("scheduler", "generate", "engine_loop"),
    ("serve",),
)
"""The runtime's parts from the bottom up (``sf_trt.<part>`` and its submodules): the ABI;
what is read from disk (formats, tokenizers, the model cache); the ONNX graphs the runtime
builds; plans, events and outputs, and the backend protocol with its host memory (the block pool); drafters and their
registration, each lane's logit adjustments and grammar, and the prefix cache; the executor (and what drives it in tests); the backends that implement
the protocol; whole requests over the executor; the HTTP shell."""
PACKAGE_OF = {"sf_trt": "sf_trt", "export": "sf_trt.export", "cli": "sf_trt.cli"}
"""Folder -> the package name it is installed as (pyproject's package-dir)."""


def modules(root: Path) -> dict[str, tuple[Path, int]]:
    """Every module of the three folders: name -> (file, layer)."""
    out = {}
    for folder, layer in LAYERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([PACKAGE_OF[folder], *parts])
            entry = name == ENTRY[0] or name == ENTRY[1] or name.startswith(ENTRY[1] + ".")
            out[name] = (path, ENTRY_LAYER if entry else layer)
    return out


def inner_rank(name: str) -> int | None:
    """Where a runtime module stands in :data:`INNER` (None: not a runtime part)."""
    part = name.split(".")[1] if name.startswith("sf_trt.") else None
    return next((i for i, parts in enumerate(INNER) if part in parts), None)


def layer_of(name: str, mods: dict) -> int | None:
    """The layer of the module ``name`` resolves to (the longest known prefix)."""
    while name:
        if name in mods:
            return mods[name][1]
        name = name.rpartition(".")[0]
    return None


def imports_of(name: str, path: Path, mods: dict) -> set[str]:
    """The known modules ``name`` (at ``path``) imports, anywhere in the file."""
    is_package = path.name == "__init__.py"
    found = set()
    named = set()  # packages this file takes a name from that is no module (their __init__'s own)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods}
            if any(f"{base}.{a.name}" not in mods for a in node.names):
                named.add(base)
    resolved = set()
    for target in found:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        # a parent package is no arrow, unless a name of its own __init__ is taken from it
        if target and target != name and (not name.startswith(target + ".") or target in named):
            resolved.add(target)
    return resolved


def violations(root: Path = ROOT) -> list[str]:
    """Each arrow that runs up a layer, and each circle of modules; empty when the house is sound."""
    mods = modules(root)
    graph = {name: imports_of(name, path, mods) for name, (path, _) in mods.items()}
    found = []
    for name, targets in sorted(graph.items()):
        path, layer = mods[name]
        for target in sorted(targets):
            if layer_of(target, mods) > layer:
                found.append(f"{path.relative_to(root)} ({name}) imports {target}: an arrow up from layer {layer} to {layer_of(target, mods)}")
            elif layer == layer_of(target, mods) == 0 and inner_rank(name) is not None and inner_rank(target) is not None \
                    and inner_rank(target) > inner_rank(name):
                found.append(f"{path.relative_to(root)} ({name}) imports {target}: an arrow up inside the runtime, "
                             f"from {'/'.join(INNER[inner_rank(name)])} to {'/'.join(INNER[inner_rank(target)])}")
    found += [f"circle: {' -> '.join(c + [c[0]])}" for c in _circles(graph)]
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_house_has_one_way_arrows_and_no_circles():
    found = violations()
    assert not found, "the house is broken:\n" + "\n".join(found)


def test_the_check_catches_a_planted_arrow_and_a_planted_circle(tmp_path):
    for folder in LAYERS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    executor = tmp_path / "sf_trt" / "executor.py"
    executor.write_text(executor.read_text() + "\nfrom sf_trt.export import pipeline  # planted\n")
    abi = tmp_path / "sf_trt" / "abi.py"
    abi.write_text(abi.read_text() + "\nfrom . import engine  # planted: engine imports abi\n")
    files = tmp_path / "sf_trt" / "formats" / "files.py"
    files.write_text(files.read_text() + "\n\ndef _planted():\n    from ..executor import Executor  # planted: lazy, up the inner order\n")
    primitives = tmp_path / "sf_trt" / "primitives.py"
    primitives.write_text(primitives.read_text() + "\nfrom . import LLM  # planted: a name of the package's door\n")
    found = violations(tmp_path)
    assert "sf_trt/primitives.py (sf_trt.primitives) imports sf_trt: an arrow up from layer 0 to 2" in found
    assert "sf_trt/executor.py (sf_trt.executor) imports sf_trt.export.pipeline: an arrow up from layer 0 to 1" in found
    assert ("sf_trt/formats/files.py (sf_trt.formats.files) imports sf_trt.executor: an arrow up inside the runtime, "
            "from formats/tokenizer/models to executor/testing/faults") in found
    assert any(v.startswith("circle: ") and "sf_trt.abi" in v and "sf_trt.engine" in v for v in found), found


def test_every_runtime_part_has_a_place_in_the_inner_order():
    parts = {name.split(".")[1] for name, (_, layer) in modules(ROOT).items() if layer == 0 and name.startswith("sf_trt.")}
    assert parts == {p for group in INNER for p in group}, parts ^ {p for group in INNER for p in group}


def test_the_entry_points_sit_above_the_build_steps_and_below_the_command_line():
    mods = modules(ROOT)
    assert layer_of("sf_trt.entrypoints.llm", mods) == layer_of("sf_trt", mods) == ENTRY_LAYER
    assert LAYERS["export"] < ENTRY_LAYER < LAYERS["cli"]


def test_every_package_folder_is_installed():
    """pyproject's explicit package list names every folder with an __init__.py."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {name for name, (path, _) in modules(ROOT).items() if path.name == "__init__.py"}
    assert listed == folders, (sorted(folders - listed), sorted(listed - folders))


def test_sf_trt_imports_without_tensorrt_or_torch():
    code = (
        "import sys\n"
        "for m in ('tensorrt', 'tensorrt_lean', 'torch', 'cuda'):\n"
        "    sys.modules[m] = None  # any import of them raises ImportError\n"
        "import sf_trt, sf_trt.backends, sf_trt.backends.tensorrt, sf_trt.cli\n"
        "import sf_trt.export.trt_support, sf_trt.export.trt_build\n"
        "assert sys.modules['tensorrt'] is None and sys.modules['torch'] is None\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_a_users_export_py_or_cli_py_does_not_shadow_sf_trt(tmp_path):
    (tmp_path / "export.py").write_text('raise SystemExit("shadowed")\n')
    (tmp_path / "cli.py").write_text('raise SystemExit("shadowed")\n')
    (tmp_path / "user.py").write_text(
        "from sf_trt.executor import Executor, ExecutorConfig\n"
        "from sf_trt.fake import FakeConfig, FakePrimitives\n"
        "from sf_trt.testing import Harness\n"
        "h = Harness.with_engine(Executor(FakePrimitives(FakeConfig(vocab=64, eos=63)), ExecutorConfig()))\n"
        "ev = h.tick_ok(h.plan().admit(1, h.prompt([1, 2, 3])).prefill(1, 0, 3).decode(1, 4))\n"
        "print(len(h.rings_tokens(ev.emit_for(1).token_ref)))\n"
    )
    for cmd in (
        [sys.executable, "-m", "sf_trt.cli", "build", "--help"],
        [sys.executable, "-c", "import sf_trt.fake, sf_trt.backends.ort_sampler, sf_trt.export.pipeline; print('ok')"],
        [sys.executable, "user.py"],
    ):
        proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0 and "shadowed" not in proc.stdout + proc.stderr, (cmd, proc.stdout, proc.stderr)
        assert proc.stdout.strip(), cmd
