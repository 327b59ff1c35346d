"""``sf-trt bench``: identical outputs, bad prompt files."""

from __future__ import annotations

import json

import pytest
from cli_run import refused, sf_trt


@pytest.mark.slow
def test_bench_reports_identical_outputs(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"id": "copy", "messages": [{"role": "user", "content": "Repeat exactly: the cat sat on the mat, the cat sat on the mat."}], "max_tokens": 20}) + "\n"
        + json.dumps({"id": "ids", "prompt_ids": [100, 200, 300, 100, 200], "max_tokens": 12}) + "\n"
    )
    outputs = {}
    for policy in ("load-aware", "always"):
        proc = sf_trt("bench", "--prompts", str(prompts), "--lanes", "2", "--draft-policy", policy, "--json", check=True)
        report = json.loads(proc.stdout)
        assert report["settings"]["draft_policy"] == policy
        assert [r["id"] for r in report["results"]] == ["copy", "ids"]
        for r in report["results"]:
            assert r["identical"] is True
            assert r["plain"]["tokens"] == r["spec"]["tokens"] > 0
            assert r["plain"]["tokens_per_s"] > 0 and r["spec"]["tokens_per_s"] > 0
            assert 0 < r["plain"]["first_token_s"] and 0 < r["spec"]["first_token_s"]
        assert report["prefill_seconds"] > 0 and all(report["decode_tokens_per_s"][k] > report["throughput_tokens_per_s"][k] for k in ("plain", "spec"))
        outputs[policy] = [(r["spec"]["tokens"], r["spec"]["finish"]) for r in report["results"]]
        assert sum(r["spec"]["proposed"] for r in report["results"]) > 0  # two lanes: both policies draft
    assert outputs["load-aware"] == outputs["always"]


def test_bad_prompt_files_are_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    assert "exactly one of messages, prompt, prompt_ids" in refused("bench", "--prompts", str(bad))
    bad.write_text("{not json\n")
    assert "not JSON" in refused("bench", "--prompts", str(bad))
    assert "cannot read" in refused("bench", "--prompts", str(tmp_path / "missing.jsonl"))


def test_every_line_is_checked_before_any_model_is_loaded_or_prompt_run(tmp_path, monkeypatch, capsys):
    """The last line is bad: refused before the model is fetched (an unwritable cache would say so first)
    and, for what needs the tokenizer, before the backend opens (a missing manifest would say so first)."""
    from tiny_gguf import write_tiny_gguf

    from sf_trt.cli import main

    write_tiny_gguf(tmp_path / "t64.gguf", context_length=64)
    good = "".join(json.dumps({"id": f"p{i}", "prompt": "the the", "max_tokens": 2}) + "\n" for i in range(3))
    (tmp_path / "cache").write_text("not a directory")
    monkeypatch.setenv("SF_TRT_CACHE", str(tmp_path / "cache"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(good + '{"id": {"nested": 1}, "prompt": "the"}\n')
    assert main(["bench", "--prompts", str(prompts), "--gguf", str(tmp_path / "t64.gguf")]) == 1
    assert capsys.readouterr().err.strip() == f"sf-trt: {prompts}:4: id must be a non-empty string or an int (got an object)"

    monkeypatch.setenv("SF_TRT_CACHE", str(tmp_path / "cache2"))
    prompts.write_text(good + json.dumps({"id": "long", "prompt": "x" * 90}) + "\n")
    assert main(["bench", "--prompts", str(prompts), "--gguf", str(tmp_path / "t64.gguf"),
                 "--backend", "tensorrt", "--engines", str(tmp_path / "no_engines")]) == 1
    err = capsys.readouterr()
    assert err.out == "" and err.err.strip().splitlines()[-1] == (
        f"sf-trt: {prompts}:4 (id long): prompt: 90 tokens leave no room in the model's context of 64")


def test_the_decode_only_rate_is_left_out_where_the_run_is_nearly_all_prefill():
    """The run and its prefill are timed apart: where little or nothing is left after taking the
    prefill out, their difference is noise, and no rate is given (``null``, printed "n/a")."""
    from sf_trt.cli.bench import DECODE_SHARE_MIN, _decode_rate

    assert _decode_rate(10, 1.0, 0.5) == pytest.approx(20.0)
    assert _decode_rate(10, 1.0, 1.0 - DECODE_SHARE_MIN) is None
    assert _decode_rate(10, 1.0, 1.2) is None


def test_repeats_count_the_fastest_run_and_check_every_repeat_gives_the_same_tokens(tmp_path, monkeypatch, capsys):
    """``--repeats 3``: each group runs three times, plain, speculative and its prefill alike; the report
    counts the fastest of each and says every repeat of a request gave the same tokens (sampled here, so
    the seed keys them), and its requests end as a single run's do; 0 repeats is refused."""
    from tiny_gguf import write_tiny_gguf

    from sf_trt.cli import main

    write_tiny_gguf(tmp_path / "t.gguf", context_length=128)
    monkeypatch.setenv("SF_TRT_CACHE", str(tmp_path / "cache"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt_ids": [5, 6, 7, 5, 6, 7, 5][: 4 + i], "max_tokens": 12}) + "\n" for i in range(3)))
    reports = {}
    for repeats in (1, 3):
        args = ["bench", "--prompts", str(prompts), "--gguf", str(tmp_path / "t.gguf"), "--lanes", "2", "--temperature", "0.8",
                "--seed", "3", "--ignore-eos", "--json", "--repeats", str(repeats)]
        assert main(args) == 0
        reports[repeats] = json.loads(capsys.readouterr().out)
    assert reports[3]["settings"]["repeats"] == 3 and reports[1]["settings"]["repeats"] == 1
    for r in reports[3]["results"]:
        assert r["identical"] is True and r["repeats_identical"] is True and r["plain"]["tokens"] == 12
    assert [r["id"] for r in reports[3]["results"]] == ["p0", "p1", "p2"]
    assert reports[3]["prefill_seconds"] > 0 and reports[3]["throughput_tokens_per_s"]["plain"] > 0
    assert [(r["spec"]["tokens"], r["spec"]["finish"], r["spec"]["accepted"]) for r in reports[3]["results"]] == [
        (r["spec"]["tokens"], r["spec"]["finish"], r["spec"]["accepted"]) for r in reports[1]["results"]]
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--prompts", str(prompts), "--repeats", "0"])
    assert exit_.value.code == 2 and "argument --repeats: expected repeats in 1..100, got 0" in capsys.readouterr().err


def test_a_repeat_that_gives_other_tokens_fails_the_bench_naming_the_request(tmp_path, monkeypatch, capsys):
    """``--repeats``: a repeat whose tokens differ from the first run's (a backend that is not deterministic;
    here a stand-in Generator drops the last token of the second plain run of the first prompt) makes the
    request not identical and the bench exit 1 with a line naming it, apart from a spec/plain difference."""
    import dataclasses

    from tiny_gguf import write_tiny_gguf

    import sf_trt.cli.bench
    from sf_trt.cli import main

    real_generator = sf_trt.cli.bench.generator
    plain_runs = {"n": 0}

    def generator(prims, args, **kw):
        gen = real_generator(prims, args, **kw)
        run = gen.run

        def changed_run(requests, *a, **k):
            results = run(requests, *a, **k)
            if all(not r.speculate and r.params.max_tokens > 1 for r in requests):
                plain_runs["n"] += 1
                if plain_runs["n"] == 2:  # the first group's second plain run
                    results[0] = dataclasses.replace(results[0], tokens=results[0].tokens[:-1])
            return results

        gen.run = changed_run
        return gen

    monkeypatch.setattr(sf_trt.cli.bench, "generator", generator)
    write_tiny_gguf(tmp_path / "t.gguf", context_length=128)
    monkeypatch.setenv("SF_TRT_CACHE", str(tmp_path / "cache"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt_ids": [5, 6, 7, 5, 6][: 4 + i], "max_tokens": 8}) + "\n" for i in range(2)))
    code = main(["bench", "--prompts", str(prompts), "--gguf", str(tmp_path / "t.gguf"), "--ignore-eos", "--json", "--repeats", "2"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 1
    assert [(r["id"], r["repeats_identical"], r["identical"]) for r in report["results"]] == [("p0", False, False), ("p1", True, True)]
    assert captured.err.strip().splitlines()[-1] == "sf-trt: a repeat of the same request gave other tokens on p0"
