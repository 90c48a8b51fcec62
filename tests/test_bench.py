"""The benchmark suite on the CPU: its workload registry and FLOP model, the timing
protocol's round order, the providers' n/a rules, the reports, and a dry run end to end
(so that `flamia bench` cannot rot while no GPU runs it)."""
import json
import math

import pytest
import torch

from flamia.bench import report, run
from flamia.bench.flops import flops, tflops_per_s
from flamia.bench.fp8 import quantize_per_tensor
from flamia.bench.jobs import autograd_job, staged_job
from flamia.bench.providers import Provider, flamia_recipe, registry, select_providers
from flamia.bench.report import Record
from flamia.bench.timing import Protocol, paired_rounds
from flamia.bench.workloads import (BASES, GROUPS, WORKLOADS, log_uniform_lengths, select_workloads,
                                    shrink)
from flamia.recipes import Recipe

STATED = {  # name -> (documents, total tokens), as the issue and the paper state them
    "eq4x4k": (4, 16384), "eq8x8k": (8, 65536), "skew8k+32x256": (33, 16384),
    "skew8k+224x256": (225, 65536), "logu11-16k": (11, 16384), "logu29-64k": (29, 65536),
}


@pytest.mark.parametrize("name", list(STATED))
def test_workload_lengths_sum_as_stated(name):
    documents, total = STATED[name]
    lengths = WORKLOADS[name].lengths
    assert (len(lengths), sum(lengths)) == (documents, total)
    if name.startswith("logu"):
        assert 128 <= min(lengths) and max(lengths) <= 8192 and len(set(lengths)) > 1
        assert log_uniform_lengths(documents, total, seed=documents) == lengths  # fixed by its seed
    for suffix in ("-nc", "-gqa", "-d64", "-nc-gqa-d64"):
        assert WORKLOADS[name + suffix].lengths == lengths


def test_workload_registry_variants_and_selection():
    assert len(WORKLOADS) == 6 * 8 and all(len(GROUPS[g]) == 6 for g in ("causal", "noncausal", "gqa", "d64"))
    w = WORKLOADS["logu11-16k-nc-gqa-d64"]
    assert (w.causal, w.heads_q, w.heads_kv, w.head_dim) == (False, 16, 4, 64)
    base = WORKLOADS["logu11-16k"]
    assert (base.causal, base.heads_q, base.heads_kv, base.head_dim) == (True, 16, 16, 128)
    assert [x.name for x in select_workloads("eq4x4k,causal")] == list(BASES)
    with pytest.raises(ValueError, match="--workloads"):
        select_workloads("eq4x4k-fp4")
    with pytest.raises(ValueError, match="total"):
        log_uniform_lengths(3, 100, seed=0)
    tiny = shrink(WORKLOADS["skew8k+32x256-gqa"])
    assert tiny.lengths == (128,) + (4,) * 32 and (tiny.heads_q, tiny.heads_kv) == (2, 1)


def test_flop_model_on_a_known_case():
    eq = WORKLOADS["eq4x4k"]
    assert flops(eq, "fwd") == 2**38  # 4 docs * 4 * 4096^2 * 128 * 16 / 2
    assert flops(WORKLOADS["eq4x4k-nc"], "fwd") == 2**39
    assert (flops(eq, "bwd"), flops(eq, "train")) == (2.5 * 2**38, 3.5 * 2**38)
    assert flops(WORKLOADS["eq4x4k-gqa"], "fwd") == 2**38 and flops(WORKLOADS["eq4x4k-d64"], "fwd") == 2**37
    skew = WORKLOADS["skew8k+32x256"]
    assert flops(skew, "fwd") == 0.5 * 4 * 128 * 16 * (8192**2 + 32 * 256**2)
    assert tflops_per_s(eq, "fwd", ms=1.0) == pytest.approx(2**38 / 1e9)
    with pytest.raises(ValueError, match="mode"):
        flops(eq, "memory")


def test_paired_rounds_discard_warmup_and_alternate_order():
    calls = []
    samples = {"a": [99.0, 1.0, 3.0, 2.0], "b": [99.0, 10.0, 30.0, 20.0], "c": [99.0, 5.0]}

    def clock(job, replays):
        job()
        key = calls[-1]
        if key == "c" and len([k for k in calls if k == "c"]) == 3:
            raise RuntimeError("device lost\nsecond line")
        return samples[key].pop(0)

    jobs = {key: (lambda key=key: calls.append(key)) for key in "abc"}
    timings, errors = paired_rounds(jobs, clock, Protocol(rounds=3, warmup_rounds=1, min_ms=0.0, graphs=False))
    assert "".join(calls) == "abc" + "cba" + "abc" + "ba"  # c fails in round 2, then is dropped
    assert errors == {"c": "error: RuntimeError: device lost"}
    assert (timings["a"].ms, timings["a"].spread, timings["a"].samples) == (2.0, 1.0, (1.0, 3.0, 2.0))
    assert (timings["b"].ms, timings["b"].spread) == (20.0, 1.0)


def test_paired_rounds_alone_run_each_job_back_to_back():
    calls = []
    jobs = {key: (lambda key=key: calls.append(key)) for key in "ab"}
    protocol = Protocol(rounds=2, warmup_rounds=1, min_ms=0.0, graphs=False, interleave=False)
    timings, errors = paired_rounds(jobs, lambda job, replays: job() or 1.0, protocol)
    assert "".join(calls) == "aaabbb" and not errors
    assert timings["a"].samples == (1.0, 1.0) and timings["b"].samples == (1.0, 1.0)  # warm-up dropped


def test_paired_rounds_replay_enough_to_fill_min_ms():
    replays_seen = []

    def clock(job, replays):
        replays_seen.append(replays)
        return 3.0

    timings, _ = paired_rounds({"a": lambda: None}, clock, Protocol(rounds=2, warmup_rounds=1, min_ms=20.0))
    assert replays_seen == [1, 1, 7, 7, 7] and timings["a"].ms == 3.0  # ceil(20 / 3) replays per round


def test_paired_rounds_size_samples_by_a_warm_call():
    """A first call that compiles and records (100 ms) does not set the calls per sample."""
    times = iter([100.0, 3.0, 3.0, 3.0, 3.0])
    replays_seen = []

    def clock(job, replays):
        replays_seen.append(replays)
        return next(times)

    paired_rounds({"a": lambda: None}, clock, Protocol(rounds=2, warmup_rounds=1, min_ms=20.0))
    assert replays_seen == [1, 1, 7, 7, 7]


def test_staged_jobs_run_the_forward_where_each_mode_says():
    counts = {"fwd": 0, "bwd": 0}

    def forward():
        counts["fwd"] += 1
        return "state"

    def backward(state):
        assert state == "state"
        counts["bwd"] += 1

    expected = {"fwd": ((0, 0), (1, 0)), "bwd": ((1, 0), (0, 1)), "train": ((0, 0), (1, 1))}
    for mode, (build_calls, per_call) in expected.items():
        counts.update(fwd=0, bwd=0)
        job = staged_job(forward, backward, mode)
        assert (counts["fwd"], counts["bwd"]) == build_calls
        job()
        assert (counts["fwd"] - build_calls[0], counts["bwd"] - build_calls[1]) == per_call, mode
    with pytest.raises(ValueError, match="mode"):
        staged_job(forward, backward, "memory")


def test_provider_rules_name_why_a_cell_is_na():
    peers = {p.key: p for p in registry()}
    logu, eq, eq64 = WORKLOADS["logu11-16k"], WORKLOADS["eq4x4k"], WORKLOADS["eq4x4k-d64"]
    fp8 = peers["cudnn:fp8"]
    assert fp8.unsupported(logu, "bwd") == "cuDNN FP8 backward on Hopper: dense, equal lengths only"
    assert fp8.unsupported(eq64, "train") == "cuDNN FP8 backward on Hopper: d=128 only"
    assert peers["flashinfer:bf16"].unsupported(eq, "train") == "prefill kernel: forward only"
    assert peers["sdpa-nested:bf16"].unsupported(WORKLOADS["eq4x4k-gqa"], "fwd") == "nested-tensor SDPA: no GQA"
    if not torch.cuda.is_available():
        assert peers["fa2:bf16"].unsupported(eq, "fwd") == "needs CUDA"
        assert peers["flamia:mxfp8"].unsupported(eq, "fwd") == "needs CUDA"
    assert [p.key for p in select_providers(registry(), "cudnn")] == ["cudnn:bf16", "cudnn:fp8"]
    with pytest.raises(ValueError, match="--providers"):
        select_providers(registry(), "cudnn:fp4")
    assert all(p.name == "flamia" and p.emulated for p in registry(dry_run=True))
    # The emulated recipes are timed where the padded batch stays small and named n/a beyond.
    nvfp4 = {p.key: p for p in registry(dry_run=True)}["flamia:nvfp4"]
    assert nvfp4.unsupported(WORKLOADS["skew8k+32x256"], "train").startswith("emulated: timed where")
    assert nvfp4.unsupported(WORKLOADS["logu29-64k"], "fwd").startswith("emulated: timed where")
    assert all(nvfp4.unsupported(WORKLOADS[w], "train") is None for w in ("eq4x4k", "eq8x8k", "logu11-16k"))


def test_flamia_recipes_with_flags_are_providers_of_their_own():
    """"flamia:mxfp8+bf16_scores" times the recipe with that option ("+p_sum_codes=False": one
    off), on the base recipe's backend, under a key and label of its own; an unknown flag or
    value names the argument."""
    chosen = select_providers(registry(dry_run=True), "flamia:mxfp8,flamia:mxfp8+p_sum_codes+bf16_scores")
    assert [(p.key, p.label, p.emulated) for p in chosen] == [
        ("flamia:mxfp8", "flamia MXFP8 (emulated)", True),
        ("flamia:mxfp8+p_sum_codes+bf16_scores", "flamia MXFP8+p_sum_codes+bf16_scores (emulated)", True)]
    assert flamia_recipe("nvfp4+p_sum_codes") == Recipe("nvfp4", p_sum_codes=True)
    assert not flamia_recipe("mxfp8+p_sum_codes=False").sums_codes
    for bad in ("sharp", "p_sum_codes=maybe"):
        with pytest.raises(ValueError, match=f"^--providers: 'mxfp8\\+{bad}' sets"):
            select_providers(registry(), f"flamia:mxfp8+{bad}")
    with pytest.raises(ValueError, match="^recipe: p_sum_codes needs E4M3 P codes"):
        select_providers(registry(), "flamia:bf16+p_sum_codes")


def test_per_tensor_fp8_scale_is_a_power_of_two_filling_e4m3():
    x = (torch.randn(64, 4, 32, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    codes, descale = quantize_per_tensor(x)
    assert codes.dtype == torch.float8_e4m3fn and descale.dim() == 0
    assert math.log2(descale.item()).is_integer()
    assert 224 <= codes.float().abs().max().item() <= 448
    back = codes.float() * descale
    assert torch.allclose(back, x.float(), rtol=2**-4, atol=descale.item() * 2**-9)


def _records():
    def rec(provider, recipe, ms, emulated=False, why=None, workload="w1"):
        return Record(workload, provider, recipe, "train", f"{provider} {recipe}", ms=ms,
                      tflops=None if ms is None else 100 / ms, spread=None if ms is None else 0.01,
                      why=why, emulated=emulated)
    return [rec("flamia", "mxfp8", 1.0), rec("flamia", "nvfp4", 0.5, emulated=True),
            rec("cudnn", "fp8", 1.5), rec("fa2", "bf16", 2.0), rec("sage1", "int8", None, why="a | b"),
            rec("flamia", "mxfp8", 3.0, workload="w2"), rec("cudnn", "fp8", None, why="no", workload="w2")]


def test_markdown_bolds_fastest_kernel_and_reports_speedup():
    header = {"device": "d", "date": "t", "command": "c", "versions": {}, "protocol": {}}
    text = report.markdown(header, _records())
    w1 = next(line for line in text.splitlines() if line.startswith("| w1 |"))
    cells = [c.strip() for c in w1.strip("|").split(" | ")]
    assert cells[1].startswith("**1.000 ms**") and cells[2].startswith("0.500 ms")  # emulated: never bold
    assert cells[3].startswith("1.500 ms") and cells[5] == "n/a: a \\| b" and cells[-1] == "1.50x"
    w2 = next(line for line in text.splitlines() if line.startswith("| w2 |"))
    assert w2.rstrip().endswith("| n/a |") and "not run" in w2  # no measured peer; columns w2 lacks


def test_merge_keeps_measured_cells(tmp_path):
    head = {"device": "d", "date": "t", "command": "c", "versions": {"torch": "1"}, "protocol": {}}
    first = [Record("w", "cudnn", "fp8", "train", "c", why="not installed"),
             Record("w", "flamia", "mxfp8", "train", "f", ms=1.0, tflops=1.0, spread=0.0)]
    second = [Record("w", "cudnn", "fp8", "train", "c", ms=2.0, tflops=1.0, spread=0.0),
              Record("w", "flamia", "mxfp8", "train", "f", why="error: x")]
    later = [Record("w", "flamia", "mxfp8", "train", "f", ms=1.1, tflops=1.0, spread=0.0)]
    header, merged = report.merge([({**head, "versions": {"flashinfer-python": "0.7.4"}}, second),
                                   (head, first), (head, later)])
    assert [(r.provider, r.ms) for r in merged] == [("cudnn", 2.0), ("flamia", 1.1)]
    assert header["versions"] == {"flashinfer-python": "0.7.4", "torch": "1"} and len(header["merged_from"]) == 3
    paths = report.write_report(tmp_path, header, merged)
    assert report.load(paths["json"])[1] == merged
    # A merged report merged again lists the runs it came from, and sums their wall times.
    timed = [({**head, "elapsed_s": 2.0}, first), ({**head, "elapsed_s": 3.5}, later)]
    again, _ = report.merge([report.merge(timed), (head, second)])
    assert len(again["merged_from"]) == 3 and "elapsed_s" not in again  # the last run has no time
    assert report.merge(timed)[0]["elapsed_s"] == 5.5


def _stub_provider() -> Provider:
    """A pure-torch peer, so the dry run times at least one column whatever the emulator does."""
    def build(case, mode):
        return autograd_job(lambda q, k, v: q * k.mean() + v.mean(), case.inputs, mode)
    return Provider("stub", "bf16", "stub peer", build, available=lambda: None)


def test_dry_run_writes_reports_with_every_cell_filled(tmp_path, monkeypatch):
    stub = _stub_provider()
    monkeypatch.setattr(run, "registry", lambda dry_run=False: (*registry(dry_run), stub))
    argv = ["--dry-run", "--workloads", "eq4x4k", "--providers", "flamia:bf16,stub",
            "--modes", "fwd,bwd,train,memory", "--out", str(tmp_path)]
    assert run.main(argv) == 0
    document = json.loads((tmp_path / "results.json").read_text())
    assert {"device", "versions", "date", "command"} <= set(document["header"])
    assert document["header"]["command"] == "flamia bench " + " ".join(argv)
    assert document["header"]["protocol"]["interleave"] is True
    records = document["records"]
    assert [(r["provider"], r["mode"]) for r in records] == [
        (p, m) for m in ("fwd", "bwd", "train", "memory") for p in ("flamia", "stub")]
    tiny = shrink(WORKLOADS["eq4x4k"])
    for r in records:
        assert {"workload", "provider", "recipe", "mode", "ms", "tflops", "spread"} <= set(r)
        if r["ms"] is None:
            assert isinstance(r["why"], str) and r["why"] and r["tflops"] is None
        else:
            assert "why" not in r and r["ms"] > 0
            assert r["tflops"] == pytest.approx(tflops_per_s(tiny, r["mode"], r["ms"]))
    assert all(r["ms"] is not None for r in records if r["provider"] == "stub" and r["mode"] != "memory")
    assert all(r["why"] == "needs CUDA" for r in records if r["mode"] == "memory")
    text = (tmp_path / "results.md").read_text()
    assert text.count("| eq4x4k |") == 3 and "**" in text and "n/a: needs CUDA" in text
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The providers left out by --providers are named, not silently missing.
    not_run = document["header"]["not_run"]
    assert not_run == [p.label for p in registry(True) if p.key != "flamia:bf16"]
    assert not_run and all(label in text for label in not_run)


def test_cli_names_the_bad_argument(capsys):
    with pytest.raises(SystemExit):
        run.main(["--dry-run", "--modes", "fwd,sideways"])
    assert "--modes" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_run_measures_flamia_and_the_torch_peers_in_cuda_graphs(tmp_path):
    """The real protocol on one small workload: flamia's Triton kernels, FA2 and nested SDPA
    are all measured, every call captured in a CUDA graph (no "eager" note)."""
    assert run.main(["--workloads", "logu11-16k", "--providers", "flamia:mxfp8,fa2,sdpa-nested",
                     "--modes", "train,fwd,bwd", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "results.json").read_text())["records"]
    assert len(records) == 9
    for r in records:
        assert r["ms"] is not None and "note" not in r, r
        assert 0 < r["tflops"] < 2000 and r["spread"] < 0.5, r


def test_dry_run_alone_records_the_protocol(tmp_path):
    argv = ["--dry-run", "--alone", "--workloads", "eq4x4k", "--providers", "flamia:bf16", "--modes", "fwd",
            "--out", str(tmp_path)]
    assert run.main(argv) == 0
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["header"]["protocol"]["interleave"] is False
    assert document["records"][0]["ms"] > 0
