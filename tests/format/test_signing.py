"""Optional Ed25519 signing: ``export --sign KEY`` / ``load(..., trusted_keys=[...])``. A bundle
not signed by a trusted key is refused with SignatureError before any of its code is mapped."""

from __future__ import annotations

import copy
import hashlib
import random
import subprocess
import sys

import msgpack
import numpy as np
import pytest
from mlcpack.runtime import SignatureError, load
from mlcpack.runtime.bundle import DIGEST_KEY, BundleReader
from mlcpack.runtime.errors import BundleError, MlcpackError
from mlcpack.runtime.signing import SIG_FIELD, fingerprint, signed_message

crypto = pytest.importorskip("cryptography")
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402

from bundle_parts import pack, read_parts  # noqa: E402

WEIGHTS_SEED = 21


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    from mlcpack.packager.signing import generate_key

    folder = tmp_path_factory.mktemp("keys")
    good = generate_key(folder / "good.pem")
    other = generate_key(folder / "other.pem")
    return {"good": good[0], "good_pub": good[1], "good_fp": good[2],
            "other": other[0], "other_pub": other[1]}


def _weights():
    rng = np.random.default_rng(WEIGHTS_SEED)
    return {"w0": rng.standard_normal((4, 6)).astype(np.float32),
            "b0": rng.standard_normal(4).astype(np.float32)}


def _export(path, sign_key=None):
    from mlcpack.frontends.arch import build_from_spec, infer_mlp_spec
    from mlcpack.packager.export import ExportOptions, export_module

    weights = _weights()
    mod = build_from_spec(infer_mlp_spec(weights), weights, None)
    export_module(mod, path, ExportOptions(sign_key=sign_key))
    return path


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, keys):
    folder = tmp_path_factory.mktemp("signed")
    return {"signed": _export(folder / "signed.mlc", keys["good"]),
            "other": _export(folder / "other.mlc", keys["other"]),
            "unsigned": _export(folder / "unsigned.mlc")}


X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 6)


def _public(path):
    return serialization.load_pem_public_key(path.read_bytes())


def test_signed_bundle_loads_with_its_key_in_every_form(bundles, keys) -> None:
    with load(bundles["unsigned"]) as plain:
        expected = plain(X)
    pub = _public(keys["good_pub"])
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    private = serialization.load_pem_private_key(keys["good"].read_bytes(), None)
    for trusted in ([keys["good_pub"]], [str(keys["good_pub"])], [pub], [raw],
                    [keys["good_pub"].read_text()], [keys["good_pub"].read_bytes()], [private],
                    [keys["other_pub"], keys["good_pub"]]):
        with load(bundles["signed"], trusted_keys=trusted) as model:
            assert model.signed_by == keys["good_fp"] == fingerprint(raw)
            np.testing.assert_array_equal(model(X), expected)


def test_unsigned_bundle_is_refused_when_keys_are_given(bundles, keys, mapped) -> None:
    with pytest.raises(SignatureError) as info:
        load(bundles["unsigned"], trusted_keys=[keys["good_pub"]])
    msg = str(info.value)
    assert "unsigned.mlc is not signed" in msg and "--sign" in msg and "\n" not in msg
    assert info.value.exit_code == 12 and isinstance(info.value, BundleError)
    assert mapped == []  # refused before any code was mapped


def test_wrong_key_is_refused(bundles, keys, mapped) -> None:
    with pytest.raises(SignatureError, match="other.mlc is signed by key [0-9a-f]{16}, which is "
                                             "not one of the trusted keys"):
        load(bundles["other"], trusted_keys=[keys["good_pub"]])
    with pytest.raises(SignatureError, match="not one of the trusted keys"):
        load(bundles["signed"], trusted_keys=[])  # an empty list trusts nothing
    assert mapped == []


def _rewrite(header, payloads, path):
    path.write_bytes(pack(header, payloads))
    return path


def test_tampered_signature_is_refused(tmp_path, bundles, keys, mapped) -> None:
    header, payloads = read_parts(bundles["signed"])
    trusted = [keys["good_pub"]]
    cases = {}
    # One bit of the signature, the content digest recomputed (the digest alone is no defence).
    h = copy.deepcopy(header)
    h["signature"]["sig"] = bytes([h["signature"]["sig"][0] ^ 1]) + h["signature"]["sig"][1:]
    cases["signature bit"] = (h, payloads)
    # Changed weights, digest recomputed by someone without the key.
    changed = list(payloads)
    changed[0] = bytes([changed[0][0] ^ 0x40]) + changed[0][1:]
    cases["weights"] = (header, changed)
    # A changed header field the kernels do not even use.
    h = copy.deepcopy(header)
    h["labels"] = ["evil"]
    cases["labels"] = (h, payloads)
    # The other key's signature presented under the trusted key.
    other_header, _ = read_parts(bundles["other"])
    h = copy.deepcopy(other_header)
    h["signature"]["key"] = header["signature"]["key"]
    cases["someone else's signature"] = (h, payloads)
    for what, (h, p) in cases.items():
        path = _rewrite(h, p, tmp_path / "tampered.mlc")
        for verify in (True, False):
            with pytest.raises(SignatureError, match="does not verify") as info:
                load(path, trusted_keys=trusted, verify=verify)
            assert "\n" not in str(info.value), what
    assert mapped == []
    # Without keys, a re-hashed tampered bundle is just a bundle: signing is what catches it.
    load(_rewrite(*cases["labels"], tmp_path / "labels.mlc")).close()


def test_flips_of_a_signed_bundle_are_refused_even_without_the_digest(tmp_path, bundles, keys
                                                                      ) -> None:
    """With verify=False the signature check still hashes everything it covers: a flipped bit
    loads only where it changes nothing signed (the stored SHA-256 itself)."""
    data = bundles["signed"].read_bytes()
    digest_at = data.index(DIGEST_KEY) + len(DIGEST_KEY)
    rng = random.Random(5)
    path = tmp_path / "flip.mlc"
    outcomes: dict[str, int] = {}
    positions = [rng.randrange(len(data)) for _ in range(300)] + list(range(digest_at,
                                                                          digest_at + 32, 4))
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(flipped)
        try:
            load(path, trusted_keys=[keys["good_pub"]], verify=False).close()
        except MlcpackError as exc:
            outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
            assert "\n" not in str(exc)
        else:
            assert digest_at <= pos < digest_at + 32, pos
    assert outcomes["SignatureError"] > 100, outcomes


def test_any_msgpack_reader_opens_a_signed_bundle(bundles) -> None:
    data = bundles["signed"].read_bytes()
    bundle = msgpack.unpackb(data, raw=False)
    assert list(bundle) == ["mlcpack", "sha256", "data"]
    sig = bundle["mlcpack"]["signature"]
    assert sig["alg"] == "ed25519" and len(sig["key"]) == 32 and len(sig["sig"]) == 64
    with load(bundles["signed"]) as model:  # no keys: the signature is not looked at
        assert model.signed_by is None


def test_the_signature_signs_the_zero_signature_digest(bundles, keys) -> None:
    """The documented construction, recomputed independently of runtime/signing.py."""
    data = bundles["signed"].read_bytes()
    with BundleReader(bundles["signed"]) as reader:
        sig = reader.header["signature"]["sig"]
        header_end, data_start = reader.header_end, reader.data_start
    head = bytearray(data[:header_end])
    at = head.index(SIG_FIELD + sig) + len(SIG_FIELD)
    head[at:at + 64] = bytes(64)
    digest = hashlib.sha256(bytes(head) + data[data_start:]).digest()
    _public(keys["good_pub"]).verify(sig, signed_message(digest))  # raises if wrong
    # ...and the stored content digest covers the real signature bytes.
    assert hashlib.sha256(data[:header_end] + data[data_start:]).digest() == \
        data[header_end + len(DIGEST_KEY):header_end + len(DIGEST_KEY) + 32]


@pytest.mark.parametrize("record", [None, "x", {}, {"alg": "rsa", "key": b"k" * 32, "sig": b"s" * 64},
                                    {"alg": "ed25519", "key": b"k" * 31, "sig": b"s" * 64},
                                    {"alg": "ed25519", "key": b"k" * 32, "sig": "s" * 64}])
def test_malformed_signature_record(tmp_path, bundles, keys, record) -> None:
    header, payloads = read_parts(bundles["signed"])
    header["signature"] = record
    path = _rewrite(header, payloads, tmp_path / "bad.mlc")
    with pytest.raises(SignatureError) as info:
        load(path, trusted_keys=[keys["good_pub"]])
    assert "\n" not in str(info.value)
    if record is not None:
        assert "malformed signature" in str(info.value)


def test_bad_trusted_keys_are_signature_errors(tmp_path, bundles, keys) -> None:
    rsa_like = tmp_path / "not-a-key.pem"
    rsa_like.write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    for bad in (tmp_path / "missing.pub", rsa_like, b"short", "-----BEGIN nonsense"):
        with pytest.raises(SignatureError) as info:
            load(bundles["signed"], trusted_keys=[bad])
        assert "\n" not in str(info.value)


def test_runtime_imports_cryptography_only_with_trusted_keys(bundles, keys) -> None:
    code = ("import sys\n"
            "from mlcpack.runtime import load\n"
            "load(sys.argv[1]).close()\n"
            "assert not any(m.startswith('cryptography') for m in sys.modules), 'imported early'\n"
            "load(sys.argv[1], trusted_keys=[sys.argv[2]]).close()\n"
            "assert 'cryptography' in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code, str(bundles["signed"]),
                           str(keys["good_pub"])], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_signing_key_errors(tmp_path, keys) -> None:
    from mlcpack.packager.export import ExportError
    from mlcpack.packager.signing import generate_key, load_signer

    with pytest.raises(ExportError, match="already exists"):
        generate_key(keys["good"])
    with pytest.raises(ExportError, match="not an unencrypted Ed25519 private key"):
        load_signer(keys["good_pub"])
    with pytest.raises(ExportError, match="cannot be read"):
        load_signer(tmp_path / "nope.pem")
    ssh = tmp_path / "id_ed25519"
    ssh.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption()))
    assert len(load_signer(ssh).public_key) == 32
    assert oct(keys["good"].stat().st_mode & 0o777) == "0o600"


def test_cli_keygen_sign_and_trusted_key(tmp_path, run_cli, paths, one_line_error) -> None:
    proc = run_cli("keygen", "app.pem", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "app.pem.pub" in proc.stdout
    proc = run_cli("keygen", "app.pem", cwd=tmp_path)   # never overwrites: a usage error
    assert proc.returncode == 2 and "app.pem already exists" in one_line_error(proc)
    proc = run_cli("export", paths["mlp_pickle"], "-o", "s.mlc", "--sign", "app.pem",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    png = paths["samples"] / "digit_4.png"
    proc = run_cli("infer", "s.mlc", png, "--trusted-key", "app.pem.pub", "-k", "1",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "digit_4.png: 4"
    proc = run_cli("inspect", "s.mlc", cwd=tmp_path)
    assert "signature: ed25519 key " in proc.stdout, proc.stdout
    run_cli("keygen", "stranger.pem", cwd=tmp_path)
    proc = run_cli("infer", "s.mlc", png, "--trusted-key", "stranger.pem.pub", cwd=tmp_path)
    line = one_line_error(proc)
    assert proc.returncode == SignatureError.exit_code and "not one of the trusted keys" in line
    assert not list(tmp_path.glob(".mlcpack-*"))


def test_signing_without_cryptography_is_a_usage_error(tmp_path, paths, monkeypatch) -> None:
    """`keygen` and `export --sign` where the `sign` extra is missing: one line naming the
    extra, exit 2 (usage), not 11 ("export failed"), and nothing written."""
    import sys

    from cli_in_process import run_cli_in_process

    for name in [m for m in sys.modules if m == "cryptography" or m.startswith("cryptography.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "cryptography", None)
    proc = run_cli_in_process("keygen", "app.pem", cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "pip install 'mlcpack[sign]'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "app.pem").exists()
    proc = run_cli_in_process("export", paths["mlp_pickle"], "-o", "s.mlc", "--sign", "k.pem",
                              cwd=tmp_path)
    assert proc.returncode == 2 and "cryptography" in proc.stderr, (proc.stdout, proc.stderr)
    assert not (tmp_path / "s.mlc").exists()
