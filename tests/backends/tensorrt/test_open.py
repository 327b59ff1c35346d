"""TensorRTPrimitives.open: the manifest and the engine files are checked before TensorRT is looked for,
so a machine without TensorRT still says what is wrong with them."""

from __future__ import annotations

import json

import pytest
from manifests import write_engines_dir

from sf_trt.abi import Status, StatusError
from sf_trt.backends.tensorrt import TensorRTPrimitives


def _damage(case, engines):
    manifest = engines / "manifest.json"
    data = json.loads(manifest.read_text())
    if case == "missing":
        manifest.unlink()
    elif case == "malformed":
        manifest.write_text("{not json")
    elif case == "escaping":
        data["engines"]["decoder"]["engine_file"] = "../../etc/passwd"
        manifest.write_text(json.dumps(data))
    elif case == "digest":
        (engines / "decoder.engine").write_bytes(b"not the engine that was built")
    elif case == "no engine":
        del data["engines"]["verify"]
        manifest.write_text(json.dumps(data))
    elif case == "dynamic profile":  # an engine built to take 1..8 rows: its rows could differ by the pass
        profile = data["engines"]["verify"]["settings"]["profiles"][0]
        profile["dims"]["rows"][0] = 1
        for shapes in profile["inputs"].values():
            shapes["min"][0] = 1
        manifest.write_text(json.dumps(data))


CASES = {
    "missing": "no manifest at",
    "malformed": "cannot read manifest",
    "escaping": "engine_file '../../etc/passwd' is not a path inside the engines directory",
    "digest": "refusing engine 'decoder': engine file sha256",
    "no engine": "no engine 'verify' in",
    "dynamic profile": r"engine 'verify' takes more than one shape \(rows 1..8, input lanes \[1\]..\[8\], input positions \[1\]..\[8\]\)",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_manifest_problems_are_reported_before_tensorrt_is_looked_for(tmp_path, case):
    engines = write_engines_dir(tmp_path / "engines")
    _damage(case, engines)
    with pytest.raises(StatusError, match=CASES[case]) as err:
        TensorRTPrimitives.open(engines, model="decoder", verify="verify")
    assert err.value.status == Status.UNSUPPORTED and "TensorRT not available" not in str(err.value)
