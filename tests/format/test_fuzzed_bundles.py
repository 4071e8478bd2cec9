"""Fuzzing a real (small) bundle: every mutation either loads and gives the original answer, or
raises an MlcpackError with one line; never another exception (see tests/fuzzing.py for the
mutations and what is run). A short, derandomized run for CI; ``bench/fuzz_bundle.py`` runs
100 000+ mutations in worker processes."""

from __future__ import annotations

import collections
import os
import json
import random
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzing

CI_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def seed(tmp_path_factory, export_weights) -> fuzzing.Seed:
    rng = np.random.default_rng(0)
    weights = {"w0": rng.standard_normal((5, 6)).astype(np.float32),
               "b0": rng.standard_normal(5).astype(np.float32),
               "w1": rng.standard_normal((3, 5)).astype(np.float32),
               "b1": rng.standard_normal(3).astype(np.float32)}
    path = export_weights(weights, tmp_path_factory.mktemp("fuzz") / "tiny.mlc",
                          labels=["a", "b", "c"])
    return fuzzing.make_seed(path)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzzcase") / "case.mlc"


_REGIONS = ("header", "trailer", "anywhere")


@settings(max_examples=1200, **CI_SETTINGS)
@given(kind=st.sampled_from(fuzzing.BYTE_KINDS), region=st.sampled_from(_REGIONS),
       pos=st.integers(0, 1 << 16), arg=st.integers(0, 255),
       chunk=st.binary(min_size=1, max_size=16), verify=st.booleans())
def test_byte_mutations(seed, scratch, kind, region, pos, arg, chunk, verify) -> None:
    if region == "header":
        pos %= seed.data_start
    elif region == "trailer":
        pos = seed.data_start - 1 - pos % 45
    blob = fuzzing.mutate_bytes(seed.data, kind, pos, arg, chunk)
    fuzzing.check(seed, fuzzing.Case(f"{kind}@{pos}", blob, verify, may_run=verify), scratch)


_VALUE = st.one_of(st.sampled_from(fuzzing._VALUES), st.integers(-(1 << 64), 1 << 64),
                   st.text(max_size=12), st.binary(max_size=12),
                   st.lists(st.integers(-2, 1 << 20), max_size=5),
                   st.dictionaries(st.sampled_from(["offset", "size", "name", "x"]),
                                   st.integers(-1, 1 << 20), max_size=3))


@settings(max_examples=1200, **CI_SETTINGS)
@given(where=st.integers(0, 1 << 16), op=st.sampled_from(fuzzing.HEADER_OPS), value=_VALUE,
       rnd=st.randoms(use_true_random=False))
def test_header_mutations_with_a_valid_digest(seed, scratch, where, op, value, rnd) -> None:
    paths = fuzzing.header_paths(seed.header)
    case = fuzzing.header_case(seed, paths[where % len(paths)], op, value, rnd)
    if case is not None:
        fuzzing.check(seed, case, scratch)


def test_random_sweep(seed, scratch) -> None:
    """3000 seeded random mutations of both families; each kind of outcome must occur, so the
    sweep really reaches the loader and the runner (a byte mutation that loads with the digest
    checked is a no-op, so rare)."""
    rng = random.Random(2024)
    paths = fuzzing.header_paths(seed.header)
    outcomes: collections.Counter = collections.Counter()
    for _ in range(3000):
        header = rng.random() < 0.5
        case = (fuzzing.random_header_case(seed, rng, paths) if header
                else fuzzing.random_byte_case(seed, rng))
        if case is not None:
            outcomes[("header" if header else "bytes", fuzzing.check(seed, case, scratch))] += 1
    for key in [("bytes", "BundleError"), ("bytes", "loaded"), ("header", "BundleError"),
                ("header", "ran"), ("header", "loaded")]:
        assert outcomes[key] > 10, outcomes
    assert outcomes[("bytes", "CodeLoadError")] > 0, outcomes  # corrupted ELF reached the loader


def test_the_property_catches_a_wrong_answer(seed, scratch) -> None:
    """Sanity: a bundle whose weights changed (digest recomputed) loads, so a runnable case
    with it must be reported as a violation."""
    payloads = list(seed.payloads)
    payloads[0] = bytes(b ^ 0x40 for b in payloads[0])  # w0, flipped in every float's exponent
    blob = fuzzing.pack(seed.header, payloads)
    with pytest.raises(fuzzing.PropertyViolation, match="different answer"):
        fuzzing.check(seed, fuzzing.Case("weights", blob, True, may_run=True), scratch)


def test_bench_runs_batches_in_worker_processes(tmp_path) -> None:
    """The 100k-mutation harness itself, tiny: batches in subprocesses, outcomes aggregated."""
    out = tmp_path / "fuzz.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz_bundle.py"),
                           "--mutations", "600", "--batch", "200", "--workers", "2",
                           "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["mutations"] == 600 and report["violations"] == [] and report["crashes"] == []
    assert sum(report["outcomes"].values()) == 600


def test_bench_sees_a_crashing_worker(tmp_path) -> None:
    """A segfault in a batch (injected) is reported with the case it was running."""
    out = tmp_path / "fuzz.json"
    env = {**os.environ, "MLCPACK_FUZZ_CRASH_AT": "5"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz_bundle.py"),
                           "--mutations", "20", "--batch", "20", "--workers", "1",
                           "--json", str(out)], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (crash,) = json.loads(out.read_text())["crashes"]
    assert "exit -11 at case 5" in crash and "Segmentation fault" in crash
