"""tools/trt_device_check.py's pure-CPU parts: its arguments, its JSON, and the pass/fail logic on
synthetic results, so that the one command that proves the TensorRT path on a GPU cannot pass
by accident (a check that did not run, a CUDA graph that was never captured, a divisor that
only matters to the fake)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from trt_fakes import FakeTorch

ROOT = Path(__file__).resolve().parents[3]


def _tool():
    spec = importlib.util.spec_from_file_location("trt_device_check", ROOT / "tools" / "trt_device_check.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool
    spec.loader.exec_module(tool)
    return tool


check = _tool()
ENV = {k: "x" for k in check.ENVIRONMENT_KEYS}


def _table(statuses: dict[str, list[str]]):
    t = check.Table()
    for rid, sts in statuses.items():
        for st in sts:
            data = None
            if rid == "h":
                data = {"lanes": 8, "rows_per_lane": 16, "slots_compared": 128, "slot0_vs_slot5": True, "mismatched_slots": []}
            t.rows.append(check.Row(rid, f"check {rid}", st, 0.1, "detail", data))
    return t


ALL_PASS = {c: ["PASS"] for c in check.CHECKS} | {"a": ["PASS", "PASS", "NOTE", "NOTE"], "f": ["PASS"]}


# -- arguments (its --help, and its one line without TensorRT: tests/tools/test_trt_device_check.py) ----


def test_arguments_and_what_each_run_must_pass(tmp_path):
    args = check.parse_args([])
    assert (args.out, args.json, args.gguf, args.skip_real, args.max_tokens) == (Path(".trt_device_check"), Path("trt_device_check.json"), None, False, 64)
    assert check.requested_checks(args) == ["a", "b", "c", "d", "e", "g", "h"]
    assert check.requested_checks(check.parse_args(["--skip-real"])) == ["a", "b", "c", "e", "g"]
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert check.parse_args(["--gguf", str(gguf)]).gguf == gguf


@pytest.mark.parametrize("argv, words", [
    (["--gguf", "https://example.org/model.gguf"], "'https://example.org/model.gguf' is not a local file (the device check never fetches)"),
    (["--gguf", "/nonexistent/model.gguf"], "is not a local file"),
    (["--max-tokens", "0"], "0 must be >= 1"),
])
def test_bad_arguments_exit_2_naming_them(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        check.parse_args(argv)
    assert exc.value.code == 2 and words in capsys.readouterr().err


# -- the verdict and the JSON ------------------------------------------------------------------------


def test_every_requested_check_passing_is_a_pass():
    assert check.verdict(_table(ALL_PASS).rows, list(check.CHECKS)) == (True, [])


@pytest.mark.parametrize("change, not_passed", [
    ({"e": ["FAIL"]}, ["e"]),  # e.g. the CUDA graph fell back
    ({"h": []}, ["h"]),  # the full-shape check never reported (it crashed before its row)
    ({"d": ["NOTE"]}, ["d"]),  # only NOTEs: nothing was proven
    ({"c": ["PASS", "FAIL", "PASS"]}, ["c"]),  # one variant of (c) failed
    ({"-": ["FAIL"]}, []),  # a FAIL anywhere fails the run
])
def test_a_run_with_a_missing_or_failed_check_does_not_pass(change, not_passed):
    passed, missing = check.verdict(_table({**ALL_PASS, **change}).rows, list(check.CHECKS))
    assert not passed and missing == not_passed


def test_skipping_the_real_model_passes_what_was_asked_but_is_not_complete(tmp_path):
    t = _table({c: ["PASS"] for c in check.CHECKS if c not in check.REAL_CHECKS} | {"d": ["NOTE"]})
    requested = check.requested_checks(check.parse_args(["--skip-real"]))
    report = t.to_json(ENV, requested)
    assert report["passed"] and not report["complete"] and check.check_report(report) == []


def test_the_json_has_the_schema_the_versions_and_the_full_shape_comparison(tmp_path):
    path = tmp_path / "out.json"
    code = check.finish(_table(ALL_PASS), ENV, list(check.CHECKS), path)
    report = json.loads(path.read_text())
    assert code == 0 and check.check_report(report) == []
    assert report["schema"] == 2 and report["complete"] and report["passed"] and not report["failed"]
    assert set(check.ENVIRONMENT_KEYS) <= set(report["environment"])
    (h,) = [r for r in report["rows"] if r["id"] == "h"]
    assert h["data"]["slots_compared"] == 128 and h["data"]["slot0_vs_slot5"] is True


def test_a_failing_run_writes_its_json_and_exits_1(tmp_path, capsys):
    code = check.finish(_table({**ALL_PASS, "e": ["FAIL"]}), ENV, list(check.CHECKS), tmp_path / "out.json")
    assert code == 1 and "not passed: (e) CUDA-graph replay" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.json").read_text())["not_passed"] == ["e"]


@pytest.mark.parametrize("damage, problem", [
    (lambda r: r.pop("environment"), "environment: missing"),
    (lambda r: r["environment"].pop("driver"), "environment.driver: missing"),
    (lambda r: r["rows"][0].update(status="OK"), "rows[0].status: 'OK', expected one of ('PASS', 'FAIL', 'NOTE')"),
    (lambda r: [row["data"].pop("slot0_vs_slot5") for row in r["rows"] if row["id"] == "h"], "rows (h).data.slot0_vs_slot5: missing"),
    (lambda r: r.update(passed="yes"), "passed: str, expected bool"),
])
def test_a_report_off_the_schema_is_named(damage, problem):
    report = json.loads(json.dumps(_table(ALL_PASS).to_json(ENV, list(check.CHECKS)), default=str))
    damage(report)
    assert problem in check.check_report(report)


def test_the_environment_records_the_stack_and_refuses_a_cuda_mismatch(monkeypatch):
    from trt_fakes import FakeTrt

    from sf_trt.backends.tensorrt import probes

    monkeypatch.setitem(sys.modules, "tensorrt", FakeTrt("10.13.0.35"))
    monkeypatch.setitem(sys.modules, "torch", FakeTorch())
    monkeypatch.setattr(probes, "_driver_version", lambda: "570.86.15")
    monkeypatch.setattr(probes, "_driver_cuda", lambda: "12.8")
    monkeypatch.setattr(probes, "_tensorrt_wheel", lambda: "tensorrt-cu12")
    _, env = check.environment()
    assert {k: env[k] for k in ("tensorrt", "tensorrt_wheel", "torch_cuda", "driver", "driver_cuda")} == {
        "tensorrt": "10.13.0.35", "tensorrt_wheel": "tensorrt-cu12", "torch_cuda": "12.8", "driver": "570.86.15", "driver_cuda": "12.8",
    }
    assert env["gpu"] == "Fake H200 (compute capability 9.0)" and set(check.ENVIRONMENT_KEYS) <= set(env)
    monkeypatch.setattr(probes, "_tensorrt_wheel", lambda: "tensorrt-cu13")
    with pytest.raises(check.Missing, match=r"^TensorRT's wheel is tensorrt-cu13 \(CUDA 13\) but torch 2\.8\.0\+fake runs CUDA 12\.8"):
        check.environment()


# -- (a): exact where sf_trt divides, reported elsewhere ---------------------------------------


def _float32_reciprocal(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer division as a GPU may lower it: a * float32(1 / b), floored."""
    a, b = pairs[:, 0].astype(np.float32), pairs[:, 1].astype(np.float32)
    q = np.floor(a * (np.float32(1) / b)).astype(np.int64)
    return pairs[:, 0] - q * pairs[:, 1], q


def test_integer_division_through_a_reciprocal_is_a_note_on_other_divisors_and_exact_on_powers_of_two():
    pairs, n_pow2, n_small = check.int_operands(np.random.default_rng(24))
    assert np.all((pairs[:n_pow2, 1] & (pairs[:n_pow2, 1] - 1)) == 0)
    assert not np.any((pairs[n_pow2:n_small, 1] & (pairs[n_pow2:n_small, 1] - 1)) == 0)
    judged = check.judge_int_division(pairs, n_pow2, n_small, *_float32_reciprocal(pairs))
    assert judged["pow2"]["wrong"] == 0 and judged["other"]["wrong"] > 0 and judged["wide"]["wrong"] > 0
    rows = check.int_division_rows(judged)
    assert [r[0] for r in rows] == ["PASS", "NOTE", "NOTE"]
    assert "a division through a float32 reciprocal" in rows[1][2]


def test_a_wrong_power_of_two_division_fails_and_exact_results_pass():
    pairs, n_pow2, n_small = check.int_operands(np.random.default_rng(1))
    a, b = pairs[:, 0], pairs[:, 1]
    exact = [int(x) % int(y) for x, y in zip(a, b)], [int(x) // int(y) for x, y in zip(a, b)]
    judged = check.judge_int_division(pairs, n_pow2, n_small, *(np.array(v, dtype=object) for v in exact))
    assert [r[0] for r in check.int_division_rows(judged)] == ["PASS", "NOTE", "NOTE"]
    mod, div = (np.array(v, dtype=object) for v in exact)
    mod[1] += 1  # one power-of-two pair off by one
    rows = check.int_division_rows(check.judge_int_division(pairs, n_pow2, n_small, mod, div))
    assert rows[0][0] == "FAIL" and rows[0][2].startswith("1 of 2048 pairs wrong, e.g. ")


# -- (e) and (h) on the stand-in: they fail when they should --------------------------------------------


def test_replay_fails_when_no_cuda_graph_was_captured():
    """On the stand-in nothing is captured: (e) must say so instead of comparing plain with plain."""
    with pytest.raises(AssertionError, match=r"no CUDA graph was captured for \['model', 'verify'\]"):
        check.replay_equals_eager(lambda graphs: check.tiny_stand_in("fp32"), 256)


FULL = dict(max_lanes=8, rows_per_lane=16, max_context=64)


def test_full_shape_rows_pass_on_the_stand_in_at_8_x_16():
    detail, data = check.full_shape_rows(lambda: check.tiny_stand_in("fp32", FULL), [5, 9, 17, 3, 5, 9, 40, 41], list(range(100, 116)))
    assert data == {"lanes": 8, "rows_per_lane": 16, "slots_compared": 128, "slot0_vs_slot5": True, "mismatched_slots": []}
    assert "all 128 slots bit for bit" in detail


def test_full_shape_rows_name_the_slots_that_differ():
    """A backend whose lane slot 5 rounds differently (what NVIDIA/TensorRT#4796 reports)."""

    def make():
        p = check.tiny_stand_in("fp32", FULL)
        host = p.logits_host

        def doctored(logits):
            out = host(logits).copy()
            if out.shape[0] == 128:
                out[5 * 16 + 3] = np.nextafter(out[5 * 16 + 3], np.float32(np.inf))
            return out

        p.logits_host = doctored
        return p

    with pytest.raises(AssertionError, match=r"1 of 128 slots differ from the row alone \(first: lane, t = \[\[5, 3\]\]\); lane slot 0 != slot 5"):
        check.full_shape_rows(make, [5, 9, 17, 3], list(range(100, 116)))


def test_close_to_reference_measures_and_refuses_past_its_bound():
    same = check.close_to_reference(lambda: check.tiny_stand_in("int8"), lambda: check.tiny_stand_in("int8"), 256, check.CLOSE_TO_ORT["int8"])
    assert same[1]["max_abs_diff"] == 0.0
    fp16 = check.close_to_reference(lambda: check.tiny_stand_in("fp16"), lambda: check.tiny_stand_in("fp32"), 256, check.CLOSE_TO_ORT["fp16"])
    assert 0 < fp16[1]["max_abs_diff"] <= check.CLOSE_TO_ORT["fp16"]
    with pytest.raises(AssertionError, match=r"logits differ from onnxruntime's by up to .*, expected at most 1e-06"):
        check.close_to_reference(lambda: check.tiny_stand_in("fp16"), lambda: check.tiny_stand_in("fp32"), 256, 1e-6)


def test_main_runs_every_check_on_stand_in_tensorrt_and_fails_an_engine_that_computes_nothing(tmp_path, monkeypatch, capsys):
    """The whole command, wired as on a GPU, over stand-ins for tensorrt and torch whose engines
    build, open, run, capture and replay but compute only zeros: every check runs and reports,
    the JSON has the schema, and the run fails where zeros are wrong. (c)'s packing alone would
    pass on zeros; its comparison with onnxruntime is what fails it."""
    from trt_fakes import FakeTrt

    from sf_trt.backends.tensorrt import probes

    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "tensorrt", FakeTrt("10.13.0.35", torch=torch))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(probes, "_driver_version", lambda: "570.86.15")
    monkeypatch.setattr(probes, "_driver_cuda", lambda: "12.8")
    monkeypatch.setattr(probes, "_tensorrt_wheel", lambda: "tensorrt-cu12")
    out = tmp_path / "report.json"
    assert check.main(["--skip-real", "--out", str(tmp_path / "engines"), "--json", str(out)]) == 1
    report = json.loads(out.read_text())
    assert check.check_report(report) == [] and not report["passed"] and not report["complete"]
    status = {}
    for row in report["rows"]:
        status.setdefault(row["id"], []).append((row["check"], row["status"]))
    assert [s for _, s in status["a"]] == ["PASS", "FAIL", "NOTE", "NOTE"]  # built and run; zeros are wrong quotients
    assert status["b"] == [("verify engine: u == hash_u, tokens == reference", "FAIL")]
    packing = {c: s for c, s in status["c"]}
    assert all(packing[f"packing, tiny decoder {v}: alone == packed"] == "PASS" for v in check.TINY_VARIANTS)
    assert all(packing[f"tiny decoder {v} vs onnxruntime"] == "FAIL" for v in check.TINY_VARIANTS)
    assert status["e"] == [("CUDA-graph replay == eager, graphs captured", "PASS")]  # the stand-in captures and replays
    assert report["not_passed"] == ["a", "b", "c", "g"] and report["environment"]["driver"] == "570.86.15"
