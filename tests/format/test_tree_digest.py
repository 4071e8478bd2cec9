"""The tree digest (format 1.2): a large payload area's stored SHA-256 is over the header and the
SHA-256 of each chunk, which the reader computes on several threads. Tree mode is forced on the
demo MLP with 4 KiB chunks so that these tests are fast; the construction, corruption anywhere,
signatures, what a 1.1 runtime does and the writer's choice are checked."""

from __future__ import annotations

import collections
import hashlib
import random
from pathlib import Path

import numpy as np
import pytest
from mlcpack.packager import bundle_writer
from mlcpack.packager.bundle_writer import BundleWriter
from mlcpack.runtime import bundle as bundle_format
from mlcpack.runtime import load
from mlcpack.runtime.bundle import (DIGEST_ALG, DIGEST_KEY, BundleReader, hash_threads,
                                    tree_leaves)
from mlcpack.runtime.errors import BundleError, FormatVersionError, SignatureError

import fuzzing
from bundle_parts import pack, read_parts, write_parts
from conftest import mlp_reference

CHUNK = 4096
X = np.random.default_rng(5).random((1, 784), dtype=np.float32)


@pytest.fixture(scope="module")
def tree_mlp(tmp_path_factory, mlp_weights, export_weights) -> Path:
    """The demo MLP exported in tree mode (threshold 0, 4 KiB chunks)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bundle_writer, "TREE_MIN_BYTES", 0)
        mp.setattr(bundle_writer, "TREE_CHUNK", CHUNK)
        return export_weights(mlp_weights, tmp_path_factory.mktemp("tree") / "tree.mlc")


@pytest.fixture(scope="module")
def layout(tree_mlp) -> dict:
    data = tree_mlp.read_bytes()
    with BundleReader(tree_mlp) as reader:
        return {"data": data, "header_end": reader.header_end, "start": reader.data_start,
                "size": reader.data_size}


def _refused(path: Path, blob: bytes, match: str | None = None, **kwargs) -> str:
    path.write_bytes(blob)
    with pytest.raises(BundleError, match=match) as info:
        load(path, **kwargs).close()
    assert "\n" not in str(info.value)
    return str(info.value)


def test_tree_bundle_records_its_digest_and_runs_like_the_flat_one(tree_mlp, mlp_bundle) -> None:
    with BundleReader(tree_mlp) as reader:
        h = reader.header
    assert h["digest"] == {"alg": DIGEST_ALG, "chunk": CHUNK}
    assert h["format"] == [1, 2] and h["min_reader"] == [1, 2]
    with BundleReader(mlp_bundle[0]) as flat:
        assert "digest" not in flat.header and flat.header["min_reader"] == [1, 0]
    with load(tree_mlp) as tree, load(mlp_bundle[0]) as flat:
        y = tree(X)
        np.testing.assert_array_equal(y, flat(X))
    np.testing.assert_allclose(y, mlp_reference(mlp_bundle[1], X), rtol=1e-5, atol=1e-5)


def test_the_stored_digest_is_the_documented_construction(layout, mlp_bundle) -> None:
    """Recomputed here with hashlib alone: SHA-256(head || SHA-256 of each 4 KiB slice)."""
    data, end, start = layout["data"], layout["header_end"], layout["start"]
    payload = data[start:]
    assert len(payload) % CHUNK and len(payload) // CHUNK >= 3  # the last chunk is partial
    leaves = b"".join(hashlib.sha256(payload[i:i + CHUNK]).digest()
                      for i in range(0, len(payload), CHUNK))
    stored = data[end + len(DIGEST_KEY):end + len(DIGEST_KEY) + 32]
    assert hashlib.sha256(data[:end] + leaves).digest() == stored
    # A flat bundle keeps the 1.1 construction, which a 1.1 reader checks.
    flat = mlp_bundle[0].read_bytes()
    with BundleReader(mlp_bundle[0]) as reader:
        fend, fstart = reader.header_end, reader.data_start
    assert hashlib.sha256(flat[:fend] + flat[fstart:]).digest() == \
        flat[fend + len(DIGEST_KEY):fend + len(DIGEST_KEY) + 32]


def test_threads_agree_with_one_thread() -> None:
    rng = np.random.default_rng(3)
    blob = rng.integers(0, 256, (3 << 20) + 12345, dtype=np.uint8).tobytes()
    cuts = [0, 1, 100, 4096, 5000, 1 << 20, (1 << 20) + 64, 3 << 20, len(blob)]
    parts = [memoryview(blob)[a:b] for a, b in zip(cuts, cuts[1:])]  # one empty part too
    for chunk in (CHUNK, 1 << 20):
        expected = b"".join(hashlib.sha256(blob[i:i + chunk]).digest()
                            for i in range(0, len(blob), chunk))
        for threads in (1, 2, 3, 4, 7):
            assert tree_leaves([blob], chunk, threads) == expected, (chunk, threads)
            assert tree_leaves(parts, chunk, threads) == expected, (chunk, threads)
        assert tree_leaves(parts, chunk) == expected  # the automatic thread count
    assert tree_leaves([], CHUNK) == b"" == tree_leaves([b""], CHUNK, 4)
    assert hash_threads(100) == 1 and 1 <= hash_threads(1 << 30) <= 4


@pytest.mark.parametrize("where", ["header", "first chunk", "middle chunk", "last chunk",
                                   "last byte", "digest"])
def test_a_flipped_bit_anywhere_is_caught(tmp_path, layout, where) -> None:
    data, start, size = layout["data"], layout["start"], layout["size"]
    last = start + size // CHUNK * CHUNK
    rng = random.Random(where)
    positions = {"header": [rng.randrange(8, layout["header_end"]) for _ in range(20)],
                 "first chunk": [start, start + 1, start + CHUNK - 1],
                 "middle chunk": [start + size // 2, start + (size // CHUNK // 2) * CHUNK],
                 "last chunk": [last, last + (len(data) - last) // 2],
                 "last byte": [len(data) - 1],
                 "digest": [layout["header_end"] + len(DIGEST_KEY) + 5]}[where]
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        msg = _refused(tmp_path / "flip.mlc", bytes(flipped))
        if where != "header":
            assert "SHA-256 mismatch" in msg


def test_swapped_chunks_truncation_and_trailing_bytes(tmp_path, layout) -> None:
    data, start = layout["data"], layout["start"]
    swapped = bytearray(data)
    a, b = start + CHUNK, start + 2 * CHUNK
    swapped[a:b], swapped[b:b + CHUNK] = data[b:b + CHUNK], data[a:b]
    assert bytes(swapped) != data
    _refused(tmp_path / "swap.mlc", bytes(swapped), "SHA-256")
    for n in (start - 1, start, start + CHUNK, len(data) - CHUNK, len(data) - 1):
        _refused(tmp_path / "cut.mlc", data[:n])
        _refused(tmp_path / "cut.mlc", data[:n], verify=False)
    for extra in (b"\0", b"\0" * CHUNK):
        _refused(tmp_path / "long.mlc", data + extra, "trailing")


def test_a_changed_chunk_size_is_caught(tmp_path, layout, tree_mlp) -> None:
    data, end = layout["data"], layout["header_end"]
    field = b"\xa5chunk\xcd\x10\x00"  # "chunk": 4096 as msgpack writes it
    at = data.index(field, 0, end)
    changed = data[:at] + b"\xa5chunk\xcd\x20\x00" + data[at + len(field):]  # 8192
    _refused(tmp_path / "chunk.mlc", changed, "SHA-256")
    # The same change with the digest recomputed is a valid bundle: the chunk size is free.
    header, payloads = read_parts(tree_mlp)
    header["digest"] = {"alg": DIGEST_ALG, "chunk": 2 * CHUNK}
    with load(write_parts(tmp_path / "c8k.mlc", header, payloads)) as a, load(tree_mlp) as b:
        np.testing.assert_array_equal(a(X), b(X))


@pytest.mark.parametrize("record", [None, [], "sha256-tree", {"alg": DIGEST_ALG},
                                    {"alg": "sha512-tree", "chunk": CHUNK},
                                    {"alg": DIGEST_ALG, "chunk": CHUNK, "extra": 1},
                                    *({"alg": DIGEST_ALG, "chunk": c} for c in
                                      (0, 1, 3, 2048, 4095, 6144, -4096, 1 << 31, True, "4096",
                                       4096.0))])
def test_malformed_digest_records_are_refused(tmp_path, tree_mlp, record) -> None:
    header, payloads = read_parts(tree_mlp)
    header["digest"] = record
    path = write_parts(tmp_path / "rec.mlc", header, payloads)
    for verify in (True, False):
        with pytest.raises(BundleError, match="invalid digest record") as info:
            load(path, verify=verify).close()
        assert "\n" not in str(info.value)


def test_rewriting_a_tree_bundle_reproduces_it(tmp_path, tree_mlp) -> None:
    """write_parts and pack (what the fuzz tests re-hash with) make the same tree digest."""
    header, payloads = read_parts(tree_mlp)
    assert write_parts(tmp_path / "copy.mlc", header, payloads).read_bytes() == \
        tree_mlp.read_bytes()
    (tmp_path / "packed.mlc").write_bytes(pack(header, payloads))
    load(tmp_path / "packed.mlc").close()


def test_leaves_are_computed_once_and_never_without_verify(tree_mlp, monkeypatch) -> None:
    calls = collections.Counter()
    real = bundle_format.tree_leaves

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(bundle_format, "tree_leaves", counting)
    load(tree_mlp, verify=False).close()
    assert calls["n"] == 0
    load(tree_mlp).close()
    assert calls["n"] == 1


def test_signed_tree_bundle(tmp_path, tree_mlp, monkeypatch) -> None:
    pytest.importorskip("cryptography")
    from mlcpack.packager.signing import generate_key, load_signer

    good, good_pub, fp = generate_key(tmp_path / "good.pem")
    _, other_pub, _ = generate_key(tmp_path / "other.pem")
    header, payloads = read_parts(tree_mlp)
    header.pop("digest")
    writer = BundleWriter(tree_min_bytes=0, tree_chunk=CHUNK)
    for data in payloads:
        writer.add(data)
    path = tmp_path / "signed.mlc"
    writer.write(path, header, signer=load_signer(good))
    calls = collections.Counter()
    real = bundle_format.tree_leaves
    monkeypatch.setattr(bundle_format, "tree_leaves",
                        lambda *a, **k: calls.update(["n"]) or real(*a, **k))
    with load(path, trusted_keys=[good_pub]) as model:
        assert calls["n"] == 1  # the content check and the signature share the leaves
        assert model.signed_by == fp and model._reader.header["digest"]["chunk"] == CHUNK
        with load(tree_mlp) as plain:
            np.testing.assert_array_equal(model(X), plain(X))
    with pytest.raises(SignatureError, match="not one of the trusted keys"):
        load(path, trusted_keys=[other_pub])
    # A weight changed and the content digest recomputed: only the signature catches it.
    signed_header, signed_payloads = read_parts(path)
    signed_payloads[0] = bytes([signed_payloads[0][0] ^ 1]) + signed_payloads[0][1:]
    tampered = tmp_path / "tampered.mlc"
    tampered.write_bytes(pack(signed_header, signed_payloads))
    load(tampered).close()  # a valid bundle as far as the content digest goes
    for verify in (True, False):
        with pytest.raises(SignatureError, match="does not verify"):
            load(tampered, trusted_keys=[good_pub], verify=verify)


def test_a_1_1_reader_refuses_a_tree_bundle(tree_mlp, mlp_bundle, monkeypatch) -> None:
    monkeypatch.setattr(bundle_format, "FORMAT_MINOR", 1)
    with pytest.raises(FormatVersionError) as info:
        load(tree_mlp).close()
    msg = str(info.value)
    assert "needs a runtime that reads [1, 2]" in msg and "upgrade the runtime" in msg
    with load(mlp_bundle[0]) as model:  # small bundles stay readable by 1.1 (and 1.0)
        np.testing.assert_allclose(model(X), mlp_reference(mlp_bundle[1], X), rtol=1e-5,
                                   atol=1e-5)


def test_the_writer_chooses_tree_mode_from_8_mib(tmp_path) -> None:
    limit = bundle_writer.TREE_MIN_BYTES
    assert limit == 8 << 20
    for size, tree in ((limit - 64, False), (limit, True), (limit + 100, True)):
        writer = BundleWriter()
        writer.add(np.arange(size, dtype=np.uint8))
        path = tmp_path / f"{size}.mlc"
        writer.write(path, {"min_reader": [1, 0]})
        with BundleReader(path) as reader:
            h = reader.header
            assert ("digest" in h) == tree and h["format"] == [1, 2]
            assert h["min_reader"] == ([1, 2] if tree else [1, 0])
            if tree:
                assert h["digest"] == {"alg": DIGEST_ALG, "chunk": 1 << 20}
                assert reader.data_size // (1 << 20) >= 8
    with pytest.raises(BundleError, match="invalid digest record"):
        BundleWriter(tree_chunk=1000)


def test_fuzzing_a_tree_bundle_reaches_the_deep_checks(tmp_path, tree_mlp) -> None:
    """Header mutations are re-hashed as tree digests, so they reach the loader and the runner;
    byte mutations are refused or load."""
    seed = fuzzing.make_seed(tree_mlp)
    rng = random.Random(7)
    paths = fuzzing.header_paths(seed.header)
    outcomes: collections.Counter = collections.Counter()
    for i in range(240):
        header = i % 2 == 0
        case = (fuzzing.random_header_case(seed, rng, paths) if header
                else fuzzing.random_byte_case(seed, rng))
        if case is not None:
            outcomes[("header" if header else "bytes",
                      fuzzing.check(seed, case, tmp_path / "case.mlc"))] += 1
    assert outcomes[("header", "ran")] > 5 and outcomes[("header", "BundleError")] > 5, outcomes
    assert outcomes[("bytes", "BundleError")] > 20, outcomes
