"""Encryption at rest: checkpoints written with a key are unreadable without it, authenticated, and name the file
when the key is missing, wrong, or the file was changed; the key is never written."""

from __future__ import annotations

import base64
import json

import pytest
import torch

from rlspeed import DQN, PPO, cli
from rlspeed import checkpoint as ckpt
from rlspeed.checkpoint import MAGIC, is_encrypted, load_checkpoint, save_checkpoint
from rlspeed.errors import UserError

KEY_32 = bytes(range(160, 192))  # (raw keys: random bytes, not typed characters)
KEY_16 = bytes(range(200, 216))
#: A tensor whose bytes are easy to look for in a file.
MARKER = torch.arange(1000, 1064, dtype=torch.float32)
SECRET_NOTE = "metadata-that-must-not-be-readable"
TINY = {"num_envs": 4, "num_steps": 32, "batch_size": 64, "n_epochs": 2}


def _has_cryptography() -> bool:
    return ckpt._cryptography_gcm("aes-gcm", KEY_32) is not None


def _has_cryptography_sm4() -> bool:
    return ckpt._cryptography_gcm("sm4-gcm", KEY_16) is not None


def _has_gmssl() -> bool:
    try:
        import gmssl.sm4  # noqa: F401
    except ImportError:
        return False
    return True


needs_cryptography = pytest.mark.skipif(not _has_cryptography(), reason="needs cryptography (rlspeed[encrypt])")
#: What the tests of everything around the cipher use: AES-GCM where `cryptography` is installed, else SM4-GCM.
ANY_CIPHER, ANY_KEY = ("aes-gcm", KEY_32) if _has_cryptography() else ("sm4-gcm", KEY_16)
needs_a_cipher = pytest.mark.skipif(not (_has_cryptography() or _has_gmssl()), reason="needs cryptography or gmssl")


@pytest.fixture(autouse=True)
def _no_key_from_outside(monkeypatch):
    for name in (ckpt.KEY_ENV, ckpt.KEY_FILE_ENV, ckpt.CIPHER_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=["aes-gcm", "sm4-gcm/cryptography", "sm4-gcm/gmssl"])
def cipher(request, monkeypatch):
    """A cipher and backend, set up through the environment as a user would; skipped where its package is missing."""
    name, _, backend = request.param.partition("/")
    if name == "aes-gcm" and not _has_cryptography():
        pytest.skip("aes-gcm needs cryptography")
    if backend == "cryptography" and not _has_cryptography_sm4():
        pytest.skip("cryptography (or its OpenSSL) has no SM4")
    if backend == "gmssl":
        if not _has_gmssl():
            pytest.skip("needs gmssl")
        monkeypatch.setattr(ckpt, "_cryptography_gcm", lambda *args: None)
    key = KEY_32 if name == "aes-gcm" else KEY_16
    monkeypatch.setenv(ckpt.KEY_ENV, key.hex())
    monkeypatch.setenv(ckpt.CIPHER_ENV, name)
    return name, key


def _save(path, value=MARKER):
    return save_checkpoint(path, {"policy.weight": value, "steps": torch.tensor([7])}, {"note": SECRET_NOTE})


def test_round_trip(tmp_path, cipher):
    path = _save(tmp_path / "model")
    assert is_encrypted(path)
    tensors, meta = load_checkpoint(path)
    assert torch.equal(tensors["policy.weight"], MARKER) and tensors["steps"].tolist() == [7]
    assert meta["note"] == SECRET_NOTE and meta["digest"]["algorithm"] == "sha256"


def test_the_file_shows_neither_the_plaintext_nor_the_key(tmp_path, cipher):
    _, key = cipher
    data = _save(tmp_path / "model").read_bytes()
    assert data.startswith(MAGIC)
    header = json.loads(data[len(MAGIC) + 4:len(MAGIC) + 4 + int.from_bytes(data[len(MAGIC):len(MAGIC) + 4], "little")])
    assert header["cipher"] == cipher[0] and len(header["key_id"]) == 16
    for secret in (MARKER.numpy().tobytes(), MARKER.numpy().tobytes()[:16], SECRET_NOTE.encode(), b"policy.weight",
                   b"rlspeed-checkpoint", key, key.hex().encode(), key.hex().upper().encode(), base64.b64encode(key)):
        assert secret not in data


def test_each_file_gets_its_own_nonce(tmp_path, cipher):
    first, second = _save(tmp_path / "a").read_bytes(), _save(tmp_path / "b").read_bytes()
    assert first != second
    assert load_checkpoint(tmp_path / "a")[1]["note"] == load_checkpoint(tmp_path / "b")[1]["note"]


def test_without_a_key_loading_says_to_set_one(tmp_path, cipher, monkeypatch):
    """One sentence, a `KeyNeeded` (public: a program catches it to ask for the key, and train --resume's advice)."""
    path = _save(tmp_path / "model")
    monkeypatch.delenv(ckpt.KEY_ENV)
    with pytest.raises(ckpt.KeyNeeded, match=rf"model\.safetensors' is encrypted \({cipher[0]}\); set "
                                        "RLSPEED_CHECKPOINT_KEY or RLSPEED_CHECKPOINT_KEY_FILE"):
        load_checkpoint(path)


def test_a_wrong_key_is_named_as_such(tmp_path, cipher, monkeypatch):
    path = _save(tmp_path / "model")
    monkeypatch.setenv(ckpt.KEY_ENV, bytes(len(cipher[1])).hex())
    with pytest.raises(ckpt.KeyNeeded, match=r"model\.safetensors' was encrypted with another key "
                                             r"\(key id [0-9a-f]{16}\) "
                                             "than RLSPEED_CHECKPOINT_KEY"):
        load_checkpoint(path)


@pytest.mark.parametrize("where", ["ciphertext", "tag", "nonce in the header", "truncated"])
def test_a_changed_file_fails_authentication_even_without_verify(tmp_path, cipher, where):
    path = _save(tmp_path / "model")
    data = bytearray(path.read_bytes())
    header_end = len(MAGIC) + 4 + int.from_bytes(data[len(MAGIC):len(MAGIC) + 4], "little")
    if where == "ciphertext":
        data[header_end + 40] ^= 0x01
    elif where == "tag":
        data[-1] ^= 0x80
    elif where == "truncated":
        del data[-20:]
    else:
        nonce_at = data.index(b'"nonce": "') + len(b'"nonce": "')
        data[nonce_at] = ord("0") if data[nonce_at] != ord("0") else ord("1")
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match=rf"model\.safetensors' fails {cipher[0]} authentication with the right key: "
                                        "the file was changed"):
        load_checkpoint(path, verify=False)


def test_a_damaged_header_is_named(tmp_path, cipher):
    path = _save(tmp_path / "model")
    path.write_bytes(path.read_bytes()[:len(MAGIC) + 10])
    with pytest.raises(UserError, match=r"model\.safetensors' has a damaged encryption header"):
        load_checkpoint(path)


def test_the_digest_and_the_finite_check_still_apply_to_the_plaintext(tmp_path, cipher):
    """A file re-encrypted with the right key after its contents were edited still fails the digest; NaN is still
    refused."""
    path = _save(tmp_path / "model")
    key = ckpt.encryption_key()
    plain = ckpt._decrypt(path, path.read_bytes(), key)
    marker = MARKER.numpy().tobytes()
    edited = plain.replace(marker, torch.arange(2000, 2064, dtype=torch.float32).numpy().tobytes())
    assert edited != plain
    path.write_bytes(ckpt._encrypt(edited, key, cipher[0], path))
    with pytest.raises(UserError, match="does not match its SHA256 digest"):
        load_checkpoint(path)
    _save(tmp_path / "nan", value=torch.tensor([1.0, float("nan")]))
    with pytest.raises(UserError, match="holds NaN or infinite values"):
        load_checkpoint(tmp_path / "nan")


@pytest.mark.parametrize("backend", ["cryptography", "gmssl"])
def test_sm4_gcm_gives_rfc_8998_test_vector(backend):
    """RFC 8998's SM4-GCM test vector (appendix A.1), from `cryptography` and from the pure-Python `gmssl` path."""
    if not (_has_cryptography_sm4() if backend == "cryptography" else _has_gmssl()):
        pytest.skip(f"needs {backend} with SM4")
    key, nonce = bytes.fromhex("0123456789ABCDEFFEDCBA9876543210"), bytes.fromhex("00001234567800000000ABCD")
    aad = bytes.fromhex("FEEDFACEDEADBEEFFEEDFACEDEADBEEFABADDAD2")
    plaintext = bytes.fromhex("AAAAAAAAAAAAAAAABBBBBBBBBBBBBBBBCCCCCCCCCCCCCCCCDDDDDDDDDDDDDDDD"
                              "EEEEEEEEEEEEEEEEFFFFFFFFFFFFFFFFEEEEEEEEEEEEEEEEAAAAAAAAAAAAAAAA")
    expected = ("17F399F08C67D5EE19D0DC9969C4BB7D5FD46FD3756489069157B282BB200735D82710CA5C22F0CCFA7CBF93D496AC15"
                "A56834CBCF98C397B4024A2691233B8D" + "83DE3541E4C2B58177E065A9BF7B62EC")
    sm4 = ckpt._cryptography_gcm("sm4-gcm", key) if backend == "cryptography" else ckpt._GmsslSM4GCM(key)
    assert sm4.encrypt(nonce, plaintext, aad).hex().upper() == expected
    assert sm4.decrypt(nonce, bytes.fromhex(expected), aad) == plaintext


@pytest.mark.skipif(not (_has_cryptography_sm4() and _has_gmssl()), reason="needs both SM4 backends")
def test_sm4_backends_read_each_others_files(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt.KEY_ENV, KEY_16.hex())
    monkeypatch.setenv(ckpt.CIPHER_ENV, "sm4-gcm")
    _save(tmp_path / "by_openssl")
    real = ckpt._cryptography_gcm
    monkeypatch.setattr(ckpt, "_cryptography_gcm", lambda *args: None)
    assert torch.equal(load_checkpoint(tmp_path / "by_openssl")[0]["policy.weight"], MARKER)
    _save(tmp_path / "by_gmssl")
    monkeypatch.setattr(ckpt, "_cryptography_gcm", real)
    assert torch.equal(load_checkpoint(tmp_path / "by_gmssl")[0]["policy.weight"], MARKER)


@needs_a_cipher
def test_unencrypted_checkpoints_still_load_with_a_key_set(tmp_path, monkeypatch):
    path = _save(tmp_path / "plain")
    assert not is_encrypted(path)
    monkeypatch.setenv(ckpt.KEY_ENV, ANY_KEY.hex())
    monkeypatch.setenv(ckpt.CIPHER_ENV, ANY_CIPHER)
    assert torch.equal(load_checkpoint(path)[0]["policy.weight"], MARKER)


@needs_a_cipher
@pytest.mark.parametrize("form", ["hex text", "base64 text", "raw bytes"])
def test_the_key_can_come_from_a_file(tmp_path, monkeypatch, form):
    key_file = tmp_path / "key"
    key_file.write_bytes({"hex text": ANY_KEY.hex().encode() + b"\n", "base64 text": base64.b64encode(ANY_KEY) + b"\n",
                          "raw bytes": ANY_KEY}[form])
    monkeypatch.setenv(ckpt.KEY_FILE_ENV, str(key_file))
    monkeypatch.setenv(ckpt.CIPHER_ENV, ANY_CIPHER)
    path = _save(tmp_path / "model")
    assert is_encrypted(path)
    monkeypatch.delenv(ckpt.KEY_FILE_ENV)
    monkeypatch.setenv(ckpt.KEY_ENV, base64.b64encode(ANY_KEY).decode())  # the same key, given another way
    assert torch.equal(load_checkpoint(path)[0]["policy.weight"], MARKER)


@pytest.mark.parametrize(("text", "typed"), [
    (b"passwordpassword", 16),  # (printf 'passwordpassword' > key)
    (b"passwordpasswor\n", 15),  # (echo passwordpasswor > key: 16 bytes with its line end)
    (b"passwordpassword\n", 16),
    (b"a passphrase of 31 characters..\n", 31),  # (32 bytes with its line end)
])
def test_a_key_file_of_typed_characters_is_refused_as_a_password(tmp_path, monkeypatch, text, typed):
    """`printf 'passwordpassword' > key`: 16 typed characters were taken as the raw key bytes (the variable refuses
    them), and so were 15 or 31 typed by `echo`, whose line end made them 16 or 32 bytes; a random key's bytes are
    all typed characters (or line ends) with odds of about 2e-7 (16 bytes) or 5e-14 (32)."""
    key_file = tmp_path / "key"
    key_file.write_bytes(text)
    monkeypatch.setenv(ckpt.KEY_FILE_ENV, str(key_file))
    with pytest.raises(UserError, match=f"holds {typed} typed characters, a password rather than a key"):
        ckpt.encryption_key()


@pytest.mark.parametrize(("env", "message"), [
    ({"RLSPEED_CHECKPOINT_KEY": "abc"}, "RLSPEED_CHECKPOINT_KEY is not a 16- or 32-byte key in hex or base64"),
    ({"RLSPEED_CHECKPOINT_KEY": ""}, "RLSPEED_CHECKPOINT_KEY is empty"),
    ({"RLSPEED_CHECKPOINT_KEY_FILE": "/nonexistent/key"}, "Cannot read the checkpoint key file '/nonexistent/key'"),
    ({"RLSPEED_CHECKPOINT_KEY": KEY_32.hex(), "RLSPEED_CHECKPOINT_KEY_FILE": "/some/key"},
     "Both RLSPEED_CHECKPOINT_KEY and RLSPEED_CHECKPOINT_KEY_FILE are set"),
    ({"RLSPEED_CHECKPOINT_CIPHER": "aes-gcm"}, "cipher is set .* but no key"),
    ({"RLSPEED_CHECKPOINT_KEY": KEY_32.hex(), "RLSPEED_CHECKPOINT_CIPHER": "rot13"},
     "Unknown checkpoint cipher RLSPEED_CHECKPOINT_CIPHER='rot13'"),
    ({"RLSPEED_CHECKPOINT_KEY": KEY_32.hex(), "RLSPEED_CHECKPOINT_CIPHER": "sm4-gcm"},
     # (what to do, named: it said no fix)
     r"sm4-gcm needs a 16-byte key but RLSPEED_CHECKPOINT_KEY holds 32 bytes: give it a 16-byte key \(`python -c "
     r"\"import secrets; print\(secrets.token_hex\(16\)\)\"`\), or use aes-gcm, which takes this key "
     r"\(RLSPEED_CHECKPOINT_CIPHER=aes-gcm\)\."),
])
def test_bad_settings_are_one_sentence_and_write_nothing(tmp_path, monkeypatch, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=message):
        _save(tmp_path / "model")
    assert not list(tmp_path.iterdir())  # in particular, no checkpoint in clear
    with pytest.raises(UserError, match=message):  # what a run checks before it trains
        ckpt.encryption_settings()


def test_aes_without_cryptography_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt, "_cryptography_gcm", lambda *args: None)
    monkeypatch.setenv(ckpt.KEY_ENV, KEY_32.hex())
    with pytest.raises(UserError, match=r"aes-gcm needs the cryptography package: pip install \"rlspeed\[encrypt\]"):
        _save(tmp_path / "model")
    with pytest.raises(UserError, match="needs the cryptography package"):
        ckpt.encryption_settings()


@needs_a_cipher
def test_encryption_settings_describe_what_a_save_does(monkeypatch):
    assert ckpt.encryption_settings() is None
    monkeypatch.setenv(ckpt.KEY_ENV, ANY_KEY.hex())
    monkeypatch.setenv(ckpt.CIPHER_ENV, ANY_CIPHER)
    settings = ckpt.encryption_settings()
    assert settings == {"cipher": ANY_CIPHER, "key_id": ckpt.encryption_key().key_id,
                        "key_source": "RLSPEED_CHECKPOINT_KEY"}
    assert ANY_KEY.hex() not in repr(ckpt.encryption_key()) and str(ANY_KEY) not in repr(ckpt.encryption_key())


@needs_a_cipher
def test_algorithm_save_load_and_the_replay_file_are_encrypted(tmp_path, monkeypatch):
    monkeypatch.setenv(ckpt.KEY_ENV, ANY_KEY.hex())
    monkeypatch.setenv(ckpt.CIPHER_ENV, ANY_CIPHER)
    model = PPO("CartPole-v1", seed=0, device="cpu", **TINY).learn(128, progress_bar=False)
    path = model.save(tmp_path / "ppo")
    assert is_encrypted(path)
    restored = PPO.load(path, device="cpu")
    obs = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.as_tensor(restored.predict(obs.numpy(), deterministic=True)[0]),
                       torch.as_tensor(model.predict(obs.numpy(), deterministic=True)[0]))

    dqn = DQN("CartPole-v1", seed=0, device="cpu", num_envs=2, learning_starts=32, batch_size=16, buffer_size=500,
              net_arch=(16, 16), save_replay_buffer=True).learn(128, progress_bar=False)
    dqn_path = dqn.save(tmp_path / "dqn")
    replay = tmp_path / "dqn.replay.safetensors"
    assert is_encrypted(dqn_path) and is_encrypted(replay)
    resumed = DQN("CartPole-v1", seed=0, device="cpu", num_envs=2, learning_starts=32, batch_size=16,
                  buffer_size=500, net_arch=(16, 16), save_replay_buffer=True)
    resumed.resume(dqn_path)
    assert torch.equal(load_checkpoint(replay)[0]["obs"][:dqn.buffer.size],
                       dqn.buffer.obs[:dqn.buffer.size].cpu())

    monkeypatch.delenv(ckpt.KEY_ENV)
    with pytest.raises(UserError, match="is encrypted"):
        PPO.load(path, device="cpu")


@needs_a_cipher
def test_cli_train_and_eval_with_a_key(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    key_file = tmp_path / "key"
    key_file.write_text(ANY_KEY.hex())
    monkeypatch.setenv(ckpt.KEY_FILE_ENV, str(key_file))
    monkeypatch.setenv(ckpt.CIPHER_ENV, ANY_CIPHER)
    code = cli.main(["train", "ppo", "CartPole-v1", "--total-timesteps", "512", "--target-return", "none",
                     "--checkpoint-freq", "256", "--out", "run", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    assert is_encrypted(tmp_path / "run" / "model.safetensors")
    assert is_encrypted(tmp_path / "run" / "checkpoint.safetensors")
    capsys.readouterr()
    assert cli.main(["eval", "run", "--episodes", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 2

    monkeypatch.delenv(ckpt.KEY_FILE_ENV)
    monkeypatch.delenv(ckpt.CIPHER_ENV)
    code = cli.main(["eval", "run", "--episodes", "2"])
    err = capsys.readouterr().err
    assert code == 2 and f"is encrypted ({ANY_CIPHER}); set RLSPEED_CHECKPOINT_KEY" in err and "Traceback" not in err


def test_a_password_in_the_key_variable_is_refused(monkeypatch):
    """16 typed characters are not a 16-byte key: the variable takes hex or base64 only (a key file may be raw)."""
    from rlspeed.checkpoint import encryption_key

    monkeypatch.setenv("RLSPEED_CHECKPOINT_KEY", "passwordpassword")
    with pytest.raises(UserError, match="hex or base64"):
        encryption_key()


@needs_a_cipher
def test_a_key_file_others_can_read_is_said_once(tmp_path, monkeypatch):
    """A key file that other users can read (as `echo KEY > key` leaves it under umask 022) was taken without a
    word: anyone who reads it decrypts the checkpoints. A warning names it and the chmod, once per process; an
    owner-only file says nothing."""
    import os
    import warnings

    key_file = tmp_path / "key"
    key_file.write_text(ANY_KEY.hex())
    os.chmod(key_file, 0o644)
    monkeypatch.setenv(ckpt.KEY_FILE_ENV, str(key_file))
    monkeypatch.setenv(ckpt.CIPHER_ENV, ANY_CIPHER)
    monkeypatch.setattr(ckpt, "_SHARED_KEY_FILES_SAID", set())
    with pytest.warns(UserWarning, match=rf"key file '{key_file}' .* can be read or changed by other users \(mode "
                                         rf"0644\).*chmod 600"):
        _save(tmp_path / "model")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _save(tmp_path / "model")  # (said once)
        os.chmod(key_file, 0o600)
        monkeypatch.setattr(ckpt, "_SHARED_KEY_FILES_SAID", set())
        assert torch.equal(load_checkpoint(tmp_path / "model")[0]["policy.weight"], MARKER)
