"""``infer`` over many inputs (folders, globs, result files, --resume, --fail-fast) and the same
on Ray (mlcpack.distributed, ``infer --ray``): results equal the one-input, single-process run."""
from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from mlcpack.runtime import commands
from mlcpack.runtime.model import load
from mlcpack.runtime.preprocess import load_input


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, run_cli, paths):
    """The demo MLP with labels and batch plans 1 and 8."""
    out = tmp_path_factory.mktemp("many") / "mlp.mlc"
    proc = run_cli("export", paths["mlp_pickle"], "--labels", paths["labels"], "--batch-sizes",
                   "1,8", "-o", out)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory, paths):
    """21 digit PNGs in two folders (a nested one), and one file that is not an image."""
    root = tmp_path_factory.mktemp("imgs")
    pngs = sorted(paths["samples"].glob("digit_*.png"))
    for i in range(21):
        sub = root / ("a" if i < 12 else "b")
        sub.mkdir(exist_ok=True)
        shutil.copy(pngs[i % len(pngs)], sub / f"img_{i:03d}.png")
    (root / "b" / "img_015.png").write_bytes(b"not a png")  # replaces a good one
    return root


def expected(bundle, files):
    """Top-1 label and score per file from the Python API, one file at a time (None: bad)."""
    out = {}
    with load(bundle) as m:
        for f in files:
            try:
                x = load_input(f, m.inputs[0], m.preprocess)
            except Exception:
                out[str(f)] = None
                continue
            y = m.run({m.inputs[0].name: x})[m.outputs[0].name].reshape(-1)
            out[str(f)] = (m.labels[int(np.argmax(y))], float(y.max()), y)
    return out


def run(*args):
    lines, warns = [], []
    rc = commands.guarded(lambda: commands.infer(*args[:2], echo=lines.append,
                                                 warn=warns.append, **args[2]), err=warns.append)
    return rc, lines, warns


def test_folder_jsonl_in_order_with_a_bad_file(bundle, folder, tmp_path):
    files = sorted(folder.rglob("*.png"))
    want = expected(bundle, files)
    out = tmp_path / "r.jsonl"
    rc, lines, warns = run(bundle, [folder], dict(output=out, top_k=3, threads=2))
    assert rc == 7 and not lines
    assert warns[-1] == "error: 1 of 21 input(s) failed"
    assert "20 of 21 input(s) done" in warns[0] and "1 failed" in warns[0]
    assert any("img_015.png" in w and "not a readable image" in w for w in warns)
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["path"] for r in recs] == [str(f) for f in files]
    for r in recs:
        w = want[r["path"]]
        if w is None:
            assert "not a readable image" in r["error"]
            continue
        assert len(r["top_k"]) == 3
        assert r["top_k"][0]["label"] == w[0]
        assert r["top_k"][0]["score"] == pytest.approx(w[1], rel=1e-4, abs=1e-4)


def test_glob_csv_npz_and_stdout(bundle, folder, tmp_path):
    files = sorted((folder / "a").glob("*.png"))
    want = expected(bundle, files)
    pattern = str(folder / "a" / "img_*.png")
    rc, lines, _ = run(bundle, [pattern], dict(output=tmp_path / "r.csv", top_k=2))
    assert rc == 0
    rows = list(csv.reader(io.StringIO((tmp_path / "r.csv").read_text())))
    assert rows[0] == ["path", "label1", "score1", "label2", "score2", "error"]
    assert [r[0] for r in rows[1:]] == [str(f) for f in files]
    assert all(r[1] == want[r[0]][0] and r[-1] == "" for r in rows[1:])
    rc, _, _ = run(bundle, [pattern], dict(output=tmp_path / "r.npz"))
    d = np.load(tmp_path / "r.npz")
    assert list(d["path"]) == [str(f) for f in files] and not any(d["error"])
    np.testing.assert_allclose(d["logits"], np.stack([want[str(f)][2] for f in files]),
                               rtol=1e-4, atol=1e-4)
    # a folder, no --output: JSON lines on stdout, nothing on stderr
    rc, lines, warns = run(bundle, [folder / "a"], dict(top_k=1))
    assert rc == 0 and not warns
    assert [json.loads(t)["top_k"][0]["label"] for t in "\n".join(lines).splitlines()] == \
        [want[str(f)][0] for f in files]
    # several files as they are: still one input per model input, with the way to many
    rc, lines, warns = run(bundle, [str(f) for f in files[:3]], dict(top_k=1))
    assert rc == 7 and "give a folder or a quoted glob, or --output" in warns[-1]
    rc, lines, warns = run(bundle, [str(f) for f in files[:3]], dict(output=tmp_path / "3.jsonl"))
    assert rc == 0 and len((tmp_path / "3.jsonl").read_text().splitlines()) == 3


def test_resume_and_fail_fast(bundle, folder, tmp_path):
    out = tmp_path / "r.jsonl"
    run(bundle, [folder], dict(output=out))
    full = out.read_text().splitlines()
    out.write_text("\n".join(full[:5]) + "\n" + full[5][:20])  # interrupted mid-line
    rc, _, warns = run(bundle, [folder], dict(output=out, resume=True))
    assert rc == 7 and "5 already in" in warns[0]
    again = out.read_text().splitlines()
    assert sorted(again) == sorted(full) and again[:5] == full[:5]
    rc, _, warns = run(bundle, [folder], dict(output=tmp_path / "f.jsonl", fail_fast=True))
    assert rc == 7 and "stopped by --fail-fast" in warns[-1]
    assert len((tmp_path / "f.jsonl").read_text().splitlines()) < 21


def test_usage_errors(bundle, folder, tmp_path):
    for kw, msg in ((dict(output=tmp_path / "r.txt"), "give a .jsonl, .csv or .npz"),
                    (dict(resume=True), "--resume needs --output")):
        rc, _, warns = run(bundle, [folder], kw)
        assert rc == 2 and msg in warns[-1] and len(warns) == 1
    rc, _, warns = run(bundle, [str(tmp_path / "none*.png")], {})
    assert rc == 7 and "matches no file" in warns[-1]


def test_mlcpack_run_has_the_same_options(bundle, folder, tmp_path):
    out = tmp_path / "r.jsonl"
    proc = subprocess.run([sys.executable, "-m", "mlcpack.runtime.cli", "infer", str(bundle),
                           str(folder / "a"), "-o", str(out), "--threads", "2", "--batch-size",
                           "4", "-k", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "12 of 12 input(s) done" in proc.stderr and "\r" not in proc.stderr  # piped: quiet
    assert len(out.read_text().splitlines()) == 12


def test_progress_without_rich(monkeypatch):
    from mlcpack.runtime.many import Progress

    monkeypatch.setitem(sys.modules, "rich.progress", None)
    s = io.StringIO()
    bar = Progress(3, stream=s, enabled=True)
    assert bar.rich is None
    bar.advance(3)
    bar.close()
    assert "infer 3/3" in s.getvalue() and "items/s" in s.getvalue()
    quiet = io.StringIO()
    Progress(3, stream=quiet).advance(3)  # not a terminal: nothing
    assert quiet.getvalue() == ""


# ---- Ray --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    import ray.data
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    yield ray
    ray.shutdown()


def test_ray_predict_equals_single_process(ray_local, bundle, folder, tmp_path, monkeypatch):
    from mlcpack.distributed import predict

    files = sorted(folder.rglob("*.png"))
    want = expected(bundle, files)
    ds = ray_local.data.from_items([{"path": str(f)} for f in files], override_num_blocks=4)
    rows = predict(ds, bundle, concurrency=2, batch_size=4, top_k=2).take_all()
    assert [r["path"] for r in rows] == [str(f) for f in files]
    for r in rows:
        w = want[r["path"]]
        if w is None:  # the bad file fails alone; its batch's other rows ran
            assert "not a readable image" in r["error"]
        else:
            assert r["error"] == "" and r["label"] == w[0]
            assert r["score"] == pytest.approx(w[1], rel=1e-4, abs=1e-4)
    # the same through `infer --ray` (the running local Ray), ship as a path this time; the
    # folder given relative to the working directory: records name files as given
    monkeypatch.chdir(folder.parent)
    out = tmp_path / "ray.jsonl"
    rc, _, warns = run(bundle, [folder.name], dict(output=out, ray="", workers=2, top_k=2))
    ref = tmp_path / "local.jsonl"
    run(bundle, [folder.name], dict(output=ref, top_k=2))
    assert rc == 7 and "20 of 21" in warns[0]
    got = [json.loads(t) for t in out.read_text().splitlines()]
    exp = [json.loads(t) for t in ref.read_text().splitlines()]
    assert [g["path"] for g in got] == [e["path"] for e in exp]
    for g, e in zip(got, exp):
        assert ("error" in g) == ("error" in e)
        assert g.get("error") == e.get("error")   # the failed file named as given, both ways
        if "top_k" in e:
            assert [t["label"] for t in g["top_k"]] == [t["label"] for t in e["top_k"]]


def test_ray_worker_refuses_wrong_bytes_and_ships_paths(ray_local, bundle, folder):
    from mlcpack.distributed import BundlePredictor, predict
    from mlcpack.runtime.errors import BundleError

    with pytest.raises(BundleError, match="expected"):
        BundlePredictor(bundle.read_bytes(), sha256="0" * 64)
    files = sorted((folder / "a").glob("*.png"))[:4]
    ds = ray_local.data.from_items([{"path": str(f)} for f in files])
    rows = predict(ds, bundle, ship="path", batch_size=8).take_all()
    assert [r["label"] for r in rows] == [v[0] for v in expected(bundle, files).values()]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_resume_keeps_one_result_per_input_in_order(bundle, folder, tmp_path, suffix):
    """A failed input runs again on each --resume and replaces its old line: however often the
    run is resumed, the file has one line per input, in input order."""
    files = [str(f) for f in sorted(folder.rglob("*.png"))]
    out = tmp_path / f"r{suffix}"
    rc, _, _ = run(bundle, [folder], dict(output=out))
    first = out.read_text()
    for _ in range(3):
        rc, _, warns = run(bundle, [folder], dict(output=out, resume=True))
        assert rc == 7 and "20 already in" in warns[0] and "0 of 1 input(s) done" in warns[0]
        assert out.read_text() == first
    lines = first.splitlines()[1:] if suffix == ".csv" else first.splitlines()
    paths = [next(csv.reader([t]))[0] for t in lines] if suffix == ".csv" else \
        [json.loads(t)["path"] for t in lines]
    assert paths == files


@pytest.mark.parametrize("where", ["last", "before an option"])
def test_bare_ray_is_one_behaviour_on_both_command_lines(bundle, tmp_path, run_cli, where):
    """``--ray`` without ADDRESS means a local Ray on both command lines, as the help says
    (typer refused it: "Option '--ray' requires an argument")."""
    args = ["infer", str(bundle), str(tmp_path / "none*.png"), "--ray"]
    if where != "last":
        args += ["--workers", "2"]
    procs = [run_cli(*args), subprocess.run([sys.executable, "-m", "mlcpack.runtime.cli", *args],
                                            capture_output=True, text=True, timeout=60)]
    for proc in procs:  # got past the options to the inputs: the pattern matches nothing
        assert proc.returncode == 7 and "matches no file" in proc.stderr, proc.stderr
    assert procs[0].stderr == procs[1].stderr
