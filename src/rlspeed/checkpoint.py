"""Safe, atomic checkpoints: tensors as safetensors, everything else as JSON in the file's metadata.

Loading never unpickles. Tensors are saved from CPU copies and load onto any device. Each checkpoint carries a digest
of its tensors and metadata (SHA-256 by default, SM3 on request), checked on load; a checkpoint holding NaN or
infinite values is refused unless asked for. A write interrupted by a kill leaves only a temporary file, which the
next save of that path removes (a load deletes nothing).

Encryption at rest is opt-in: with a key in `RLSPEED_CHECKPOINT_KEY` or a file named by `RLSPEED_CHECKPOINT_KEY_FILE`,
checkpoints are written encrypted and authenticated (AES-GCM, or SM4-GCM with `RLSPEED_CHECKPOINT_CIPHER=sm4-gcm`);
the key is never written, only a short key id that lets a wrong key be named as such.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import glob
import hashlib
import hmac
import json
import math
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rlspeed.device import training_threads
from rlspeed.errors import UserError
from rlspeed.files import free_disk_bytes, local_path, process_running, refuse_irregular_file, size_text

FORMAT = "rlspeed-checkpoint"
#: 2: the metadata carries a digest. Format-1 files (no digest) still load, with a warning.
FORMAT_VERSION = 2

SUFFIX = ".safetensors"
#: The replay buffer's file beside a checkpoint `name.safetensors` (`save_replay_buffer`): `name.replay.safetensors`.
REPLAY_SUFFIX = ".replay" + SUFFIX

#: Digest algorithms a checkpoint can carry. SM3 (GB/T 32905) comes from OpenSSL through hashlib where it has it,
#: else from the `gmssl` package (`pip install "rlspeed[sm3]"`).
DIGESTS = ("sha256", "sm3")


def plain_file_mode(path: str | os.PathLike) -> None:
    """Give a temporary file (0600) the mode a plain `open(path, "w")` would have (0666 less the umask), before it is
    renamed over a user's file: a model or config is as readable as the user's other files."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def checkpoint_path(path: str | os.PathLike) -> Path:
    """The file a checkpoint path names: `path` itself if it ends in `.safetensors`, else `path` + `.safetensors`
    (appended, never replacing a suffix: `ppo_lr0.001` is `ppo_lr0.001.safetensors`); `~` is the home directory."""
    path = local_path(path)
    return path if path.suffix == SUFFIX else path.with_name(path.name + SUFFIX)


#: where a population's run directory holds each member's model (`seed_<S>.safetensors`)
MEMBERS_DIR = "members"


def _member_models(folder: Path) -> list[Path]:
    """The members' models (`seed_<S>.safetensors`) in `folder`, by seed (seed_2 before seed_10)."""
    return sorted(folder.glob("seed_*.safetensors"), key=lambda member: (len(member.stem), member.stem))


def run_model(path: str | os.PathLike) -> Path:
    """The model file `path` names: `path` itself, or a run directory's `model.safetensors`. UserError for a
    directory without one, naming a member's model where it is a population's run directory."""
    path = local_path(path)
    if not path.is_dir():
        return path
    if (path / "model.safetensors").is_file():
        return path / "model.safetensors"
    members = _member_models(path / MEMBERS_DIR)
    if members:
        raise UserError(f"'{path}' is a population's run directory: give one member's model, e.g. '{members[0]}'.")
    members = _member_models(path) if path.name == MEMBERS_DIR else []
    if members:
        raise UserError(f"'{path}' holds a population's members' models: give one, e.g. '{members[0]}'.")
    if (path / "checkpoint.safetensors").is_file():
        raise UserError(f"'{path}' holds a run that did not finish (a checkpoint, no model yet): `rlspeed train ... "
                        f"--resume --out {path}` finishes it, or give a model file.")
    raise UserError(f"'{path}' is a directory without a model.safetensors (a run directory gets one when training "
                    "finishes); give the model file.")


class _GmsslSM3:
    """SM3 from the pure-Python `gmssl` package, behind hashlib's update/hexdigest interface."""

    def __init__(self):
        from gmssl import sm3

        self._sm3 = sm3
        self._data = bytearray()

    def update(self, data) -> None:
        self._data += memoryview(data).cast("B")

    def hexdigest(self) -> str:
        return self._sm3.sm3_hash(list(self._data))


def _hasher(algorithm: str):
    """A new hashlib-style hasher for `algorithm` (one of DIGESTS); UserError when SM3 is not available."""
    if algorithm not in DIGESTS:
        raise UserError(f"Unknown checkpoint digest '{algorithm}': use one of {', '.join(DIGESTS)}.")
    try:
        return hashlib.new(algorithm)
    except ValueError:  # OpenSSL without SM3
        pass
    try:
        return _GmsslSM3()
    except ImportError:
        raise UserError("SM3 digests need OpenSSL with SM3 or the gmssl package: pip install \"rlspeed[sm3]\".") \
            from None


# --- encryption at rest ------------------------------------------------------------------------------------------

KEY_ENV = "RLSPEED_CHECKPOINT_KEY"
KEY_FILE_ENV = "RLSPEED_CHECKPOINT_KEY_FILE"
CIPHER_ENV = "RLSPEED_CHECKPOINT_CIPHER"
#: Authenticated ciphers an encrypted checkpoint can use; the first is the default. AES-GCM comes from the
#: `cryptography` package (`pip install "rlspeed[encrypt]"`); SM4-GCM (GB/T 32907 in GCM, as in RFC 8998) from it
#: where its OpenSSL has SM4, else from the pure-Python `gmssl` package (about 0.5 MB/s: fine for policies, slow for
#: replay buffers).
CIPHERS = ("aes-gcm", "sm4-gcm")
_KEY_BYTES = {"aes-gcm": (16, 32), "sm4-gcm": (16,)}
#: An encrypted checkpoint: MAGIC, a 4-byte little-endian length, that many bytes of JSON header (format, version,
#: cipher, key id, nonce), then the ciphertext of the whole safetensors file and a 16-byte GCM tag. Everything before
#: the ciphertext is authenticated as associated data, so an edited header fails like an edited ciphertext.
MAGIC = b"RLSPEED-ENCRYPTED-CHECKPOINT\n"
ENCRYPTED_FORMAT = "rlspeed-encrypted-checkpoint"
ENCRYPTED_VERSION = 1
_NONCE_BYTES = 12
_TAG_BYTES = 16


@dataclass(frozen=True)
class CheckpointKey:
    """A checkpoint encryption key and where it came from (for messages). Its repr never shows the key."""

    secret: bytes = field(repr=False)
    source: str

    @property
    def key_id(self) -> str:
        """16 hex digits that identify the key (a domain-separated SHA-256 of it) without revealing it."""
        return hashlib.sha256(b"rlspeed-checkpoint-key-id\0" + self.secret).hexdigest()[:16]


def _parse_key(text: bytes, source: str, raw: bool = False) -> bytes:
    """The 16 or 32 key bytes `text` holds as hex or base64 (`raw`: or as the bytes themselves, as a key file written
    with `head -c 32 /dev/urandom` holds them, unless they are all typed characters; never for a variable: in either,
    16 typed characters would be a password used as a key)."""
    stripped = text.strip()
    if not stripped:
        raise UserError(f"{source} is empty: give a 32-byte key in hex or base64 (e.g. the output of "
                        "`python -c \"import secrets; print(secrets.token_hex(32))\"`; 16 bytes for sm4-gcm).")
    candidates = []
    with contextlib.suppress(ValueError):
        candidates.append(bytes.fromhex(stripped.decode("ascii")))
    with contextlib.suppress(binascii.Error, ValueError):
        candidates.append(base64.b64decode(stripped, validate=True))
    # (typed characters and the line end `echo` adds are a password, which random bytes all but never look like)
    typed = all(32 <= byte < 127 or byte in b"\t\n\r" for byte in text)
    if raw and not typed:
        candidates.append(text)  # raw bytes, as `head -c 32 /dev/urandom > key` writes them
    for key in candidates:
        if len(key) in (16, 32):
            return key
    if raw and typed and (len(text) in (16, 32) or len(stripped) in (16, 32)):
        raise UserError(f"{source} holds {len(stripped)} typed characters, a password rather than a key: write a "
                        "random key there (`head -c 32 /dev/urandom > FILE`, or the output of `python -c "
                        "\"import secrets; print(secrets.token_hex(32))\"`; 16 bytes for sm4-gcm).")
    raise UserError(f"{source} is not a 16- or 32-byte key in hex or base64 (e.g. the output of "
                    "`python -c \"import secrets; print(secrets.token_hex(32))\"`; 16 bytes for sm4-gcm).")


def encryption_key(key: bytes | str | None = None) -> CheckpointKey | None:
    """The checkpoint key: `key` (raw bytes, or hex/base64 text) when given, else the environment's
    (`RLSPEED_CHECKPOINT_KEY`: hex or base64 of 16 or 32 bytes; or `RLSPEED_CHECKPOINT_KEY_FILE`: a file holding
    that, or the raw bytes); None when neither is set. UserError for an unreadable or malformed key."""
    if key is not None:
        if isinstance(key, bytes) and len(key) in (16, 32):
            return CheckpointKey(bytes(key), "the key given")
        return CheckpointKey(_parse_key(key.encode() if isinstance(key, str) else bytes(key), "The key given"),
                             "the key given")
    value, file = os.environ.get(KEY_ENV), os.environ.get(KEY_FILE_ENV)
    if value is not None and file is not None:
        raise UserError(f"Both {KEY_ENV} and {KEY_FILE_ENV} are set; set only one of them.")
    if value is not None:
        return CheckpointKey(_parse_key(value.encode(), KEY_ENV), KEY_ENV)
    if file is not None:
        source = f"The key file '{file}' ({KEY_FILE_ENV})"
        path = Path(file).expanduser()
        refuse_irregular_file(path, source, "the file that holds the key")
        try:
            text = path.read_bytes()
        except OSError as error:
            raise UserError(f"Cannot read the checkpoint key file '{file}' ({KEY_FILE_ENV}): "
                            f"{error.strerror or error}.") from None
        key = CheckpointKey(_parse_key(text, source, raw=True), f"the key file '{file}'")
        _warn_shared_key_file(file)
        return key
    return None


_SHARED_KEY_FILES_SAID: set[tuple[str, int]] = set()


def _warn_shared_key_file(file: str) -> None:
    """A warning (once per file and mode in a process) where the key file `file` may be read or changed by users
    other than its owner (group or others have read or write permission): they can then decrypt the checkpoints, or
    put in a key of their own. A warning, not a refusal: a container's secrets are often mounted so (0644, 0444)."""
    if os.name != "posix":
        return
    try:
        mode = Path(file).expanduser().stat().st_mode & 0o777
    except OSError:
        return
    if not mode & 0o066 or (file, mode) in _SHARED_KEY_FILES_SAID:
        return
    _SHARED_KEY_FILES_SAID.add((file, mode))
    warnings.warn(f"The checkpoint key file '{file}' ({KEY_FILE_ENV}) can be read or changed by other users (mode "
                  f"{mode:04o}): they can decrypt its checkpoints; chmod 600 '{file}'.", stacklevel=3)


def _refuse_cipher_without_key(cipher: str | None) -> None:
    """UserError when a cipher is asked for (`cipher`, or `RLSPEED_CHECKPOINT_CIPHER`) but no key is set: a file in
    clear is not what that asks for."""
    if cipher is not None or os.environ.get(CIPHER_ENV):
        raise UserError(f"A checkpoint cipher is set ({cipher or os.environ.get(CIPHER_ENV)}) but no key: set "
                        f"{KEY_ENV} or {KEY_FILE_ENV}, or unset {CIPHER_ENV}.")


def _cipher_name(cipher: str | None, key: CheckpointKey) -> str:
    """The cipher to encrypt with: `cipher`, else `RLSPEED_CHECKPOINT_CIPHER`, else aes-gcm; checked against the
    key's length."""
    name = cipher if cipher is not None else os.environ.get(CIPHER_ENV) or CIPHERS[0]
    name = name.strip().lower()
    if name not in CIPHERS:
        source = f"{CIPHER_ENV}=" if cipher is None else "cipher "
        raise UserError(f"Unknown checkpoint cipher {source}'{name}': use one of {', '.join(CIPHERS)}.")
    if len(key.secret) not in _KEY_BYTES[name]:
        sizes = " or ".join(str(n) for n in _KEY_BYTES[name])
        size = _KEY_BYTES[name][0]
        # (what to do: a key of the cipher's size, or a cipher this key fits, set where the cipher was chosen)
        other = next((other for other in CIPHERS if len(key.secret) in _KEY_BYTES[other]), None)
        use = ("" if other is None else f", or use {other}, which takes this key ("
               + (f"{CIPHER_ENV}={other}" if cipher is None else f"cipher='{other}'") + ")")
        raise UserError(f"{name} needs a {sizes}-byte key but {key.source} holds {len(key.secret)} bytes: give it a "
                        f"{size}-byte key (`python -c \"import secrets; print(secrets.token_hex({size}))\"`){use}.")
    return name


def checkpoint_digest(digest: str | None = None) -> str:
    """The digest algorithm of the next save: `digest`, else `RLSPEED_CHECKPOINT_DIGEST` (sha256 or sm3), else
    sha256; UserError now where it is unknown or SM3 has no implementation here."""
    asked = digest if digest is not None else os.environ.get("RLSPEED_CHECKPOINT_DIGEST", "").strip().lower()
    name = asked or "sha256"
    if name not in DIGESTS:
        where = "" if digest is not None else "RLSPEED_CHECKPOINT_DIGEST="
        raise UserError(f"Unknown checkpoint digest '{where}{name}': use one of {', '.join(DIGESTS)}.")
    _hasher(name)  # (SM3 without OpenSSL's or gmssl's: the pip command, now)
    return name


def encryption_settings(path: str | os.PathLike = "checkpoint") -> dict | None:
    """What `save_checkpoint` will do under the environment's settings: None (files in clear), or
    {"cipher", "key_id", "key_source"}. UserError now for what would fail at the first save (a malformed or unreadable
    key, an unknown cipher, a cipher without a key or without its package, an unknown `RLSPEED_CHECKPOINT_DIGEST`), so
    a run can check before it trains. `path`: the checkpoint those errors name (nothing is written)."""
    checkpoint_digest()
    key = encryption_key()
    if key is None:
        _refuse_cipher_without_key(None)
        return None
    cipher = _cipher_name(None, key)
    _aead(cipher, key, checkpoint_path(path))
    return {"cipher": cipher, "key_id": key.key_id, "key_source": key.source}


def _cryptography_gcm(name: str, secret: bytes):
    """The cipher from the `cryptography` package, or None without it (or, for SM4, when its OpenSSL lacks SM4)."""
    try:
        from cryptography.exceptions import UnsupportedAlgorithm
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError:
        return None
    block = algorithms.AES if name == "aes-gcm" else getattr(algorithms, "SM4", None)
    if block is None:
        return None
    try:
        Cipher(block(secret), modes.GCM(bytes(_NONCE_BYTES))).encryptor()
    except UnsupportedAlgorithm:
        return None
    return _CryptographyGCM(block, secret)


class _CryptographyGCM:
    """AES-GCM or SM4-GCM through `cryptography`'s Cipher API: encrypt/decrypt(nonce, data, aad), the tag after the
    ciphertext."""

    def __init__(self, block, secret: bytes):
        self._block, self._secret = block, secret

    def encrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        from cryptography.hazmat.primitives.ciphers import Cipher, modes

        encryptor = Cipher(self._block(self._secret), modes.GCM(nonce)).encryptor()
        encryptor.authenticate_additional_data(aad)
        return encryptor.update(data) + encryptor.finalize() + encryptor.tag

    def decrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers import Cipher, modes

        if len(data) < _TAG_BYTES:
            raise _AuthenticationFailed
        decryptor = Cipher(self._block(self._secret), modes.GCM(nonce, data[-_TAG_BYTES:])).decryptor()
        decryptor.authenticate_additional_data(aad)
        try:
            return decryptor.update(data[:-_TAG_BYTES]) + decryptor.finalize()
        except InvalidTag:
            raise _AuthenticationFailed from None


class _AuthenticationFailed(Exception):
    """The GCM tag does not match: wrong key, or the file was changed."""


class _GmsslSM4GCM:
    """SM4-GCM (NIST SP 800-38D over the SM4 block cipher) in pure Python, with `gmssl`'s SM4 key schedule and S-box,
    and table-driven rounds and GHASH (several times faster than `gmssl`'s own block function); its files are the same
    bytes as `cryptography`'s SM4-GCM."""

    def __init__(self, secret: bytes):
        from gmssl.sm4 import SM4_BOXES_TABLE, SM4_ENCRYPT, CryptSM4

        sm4 = CryptSM4(SM4_ENCRYPT)
        sm4.set_key(secret, SM4_ENCRYPT)
        self._round_keys = list(sm4.sk)

        def rotl(x: int, n: int) -> int:
            return ((x << n) | (x >> (32 - n))) & 0xFFFFFFFF

        def linear(b: int) -> int:  # SM4's L transform
            return b ^ rotl(b, 2) ^ rotl(b, 10) ^ rotl(b, 18) ^ rotl(b, 24)

        # the S-box and L transform of each byte of a round's input, one table per byte position
        self._t = [[linear(SM4_BOXES_TABLE[a] << shift) for a in range(256)] for shift in (24, 16, 8, 0)]
        self._ghash_tables = _ghash_tables(int.from_bytes(self._block(bytes(16)), "big"))

    def _block(self, block: bytes) -> bytes:
        """SM4 encryption of one 16-byte block."""
        t0, t1, t2, t3 = self._t
        x0, x1, x2, x3 = (int.from_bytes(block[i:i + 4], "big") for i in (0, 4, 8, 12))
        for round_key in self._round_keys:
            a = x1 ^ x2 ^ x3 ^ round_key
            x0, x1, x2, x3 = x1, x2, x3, x0 ^ t0[a >> 24] ^ t1[(a >> 16) & 255] ^ t2[(a >> 8) & 255] ^ t3[a & 255]
        return b"".join(x.to_bytes(4, "big") for x in (x3, x2, x1, x0))

    def _ghash(self, aad: bytes, ciphertext: bytes) -> int:
        def padded(data: bytes) -> bytes:
            return data + bytes(-len(data) % 16)

        message = padded(aad) + padded(ciphertext) + (8 * len(aad)).to_bytes(8, "big") \
            + (8 * len(ciphertext)).to_bytes(8, "big")
        tables = self._ghash_tables
        y = 0
        for start in range(0, len(message), 16):
            x = y ^ int.from_bytes(message[start:start + 16], "big")
            y = 0
            for table, byte in zip(tables, x.to_bytes(16, "big")):
                y ^= table[byte]
        return y

    def _ctr(self, nonce: bytes, data: bytes) -> bytes:
        stream = b"".join(self._block(nonce + (2 + i).to_bytes(4, "big")) for i in range((len(data) + 15) // 16))
        return (int.from_bytes(data, "big") ^ int.from_bytes(stream[:len(data)], "big")).to_bytes(len(data), "big")

    def _tag(self, nonce: bytes, aad: bytes, ciphertext: bytes) -> bytes:
        mask = int.from_bytes(self._block(nonce + (1).to_bytes(4, "big")), "big")
        return (self._ghash(aad, ciphertext) ^ mask).to_bytes(16, "big")

    def encrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        ciphertext = self._ctr(nonce, data)
        return ciphertext + self._tag(nonce, aad, ciphertext)

    def decrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        if len(data) < _TAG_BYTES:
            raise _AuthenticationFailed
        ciphertext, tag = data[:-_TAG_BYTES], data[-_TAG_BYTES:]
        if not hmac.compare_digest(self._tag(nonce, aad, ciphertext), tag):
            raise _AuthenticationFailed
        return self._ctr(nonce, ciphertext)


def _ghash_tables(h: int) -> list[list[int]]:
    """For GHASH with key `h`: tables[i][b] = (byte b at byte position i of a block) * h in GCM's GF(2^128)
    (bit-reflected: the block's first bit is x^0; polynomial x^128 + x^7 + x^2 + x + 1), so a block times h is 16
    lookups."""
    powers = [h]  # h * x^j for j = 0..127
    for _ in range(127):
        v = powers[-1]
        powers.append((v >> 1) ^ (0xE1 << 120) if v & 1 else v >> 1)
    tables = []
    for i in range(16):
        table = [0] * 256
        for b in range(1, 256):
            low = b & -b  # its lowest set bit is x^(8i + 7 - log2(low))
            table[b] = table[b ^ low] ^ powers[8 * i + 7 - low.bit_length() + 1]
        tables.append(table)
    return tables


def _aead(name: str, key: CheckpointKey, path: Path):
    """The AEAD for cipher `name` and `key`; UserError naming `path` when no installed package provides it."""
    aead = _cryptography_gcm(name, key.secret)
    if aead is None and name == "sm4-gcm":
        with contextlib.suppress(ImportError):
            aead = _GmsslSM4GCM(key.secret)
    if aead is None:
        needs = ("the cryptography package: pip install \"rlspeed[encrypt]\"" if name == "aes-gcm" else
                 "the cryptography package (pip install \"rlspeed[encrypt]\") or gmssl (pip install \"rlspeed[sm3]\")")
        raise UserError(f"Encrypting or decrypting '{path}' with {name} needs {needs}.")
    return aead


def _encrypt(payload: bytes, key: CheckpointKey, cipher: str, path: Path) -> bytes:
    """The encrypted file for the safetensors bytes `payload` (see MAGIC), with a fresh random nonce."""
    nonce = os.urandom(_NONCE_BYTES)
    header = json.dumps({"format": ENCRYPTED_FORMAT, "version": ENCRYPTED_VERSION, "cipher": cipher,
                         "key_id": key.key_id, "nonce": nonce.hex()}, sort_keys=True).encode()
    clear = MAGIC + len(header).to_bytes(4, "little") + header
    return clear + _aead(cipher, key, path).encrypt(nonce, payload, clear)


def is_encrypted(path: str | os.PathLike) -> bool:
    """Whether the checkpoint file `path` is encrypted (it starts with MAGIC)."""
    with open(path, "rb") as handle:
        return handle.read(len(MAGIC)) == MAGIC


def _header_entries(path: str | os.PathLike) -> dict | None:
    """The `__metadata__` entries of the safetensors file `path`, read from its header only (its size, then the header
    as JSON); None where it has none or does not read."""
    try:
        with open(path, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size)) if 2 <= size <= 100_000_000 else None
    except (OSError, ValueError):
        return None
    entries = header.get("__metadata__") if isinstance(header, dict) else None
    return entries if isinstance(entries, dict) else None


def written_by_rlspeed(path: str | os.PathLike) -> bool:
    """Whether `path` is a file rlspeed's save wrote, read from its header only (no key needed, no digest checked: a
    damaged one is still rlspeed's): encrypted by it, or safetensors whose metadata holds rlspeed's entry."""
    try:
        if is_encrypted(path):
            return True
    except OSError:
        return False
    return "rlspeed" in (_header_entries(path) or {})


def header_metadata(path: str | os.PathLike) -> dict | None:
    """The metadata of the rlspeed file `path` read from its header only: no tensor is read and no digest checked, so
    it may have been edited (for a look at what a file says, as `rlspeed report` takes its spaces; loading checks).
    None for an encrypted file (its header is sealed), or one that is not rlspeed's or does not read."""
    try:
        if is_encrypted(path):
            return None
    except OSError:
        return None
    try:
        metadata = json.loads((_header_entries(path) or {}).get("rlspeed", "null"))
    except (TypeError, ValueError):
        return None
    return metadata if isinstance(metadata, dict) else None


class KeyNeeded(UserError):
    """An encrypted checkpoint read without a key or with another key than its own: the file is whole, and only its
    key opens it (not a damaged file: `rlspeed train --resume` then advises no `--overwrite`, and a program may ask
    for the key and load again)."""


def _decrypt(path: Path, data: bytes, key: CheckpointKey | None) -> bytes:
    """The safetensors bytes of the encrypted checkpoint `data` (read from `path`); UserError naming the file without
    a key, with another key, or when authentication fails (the file was changed)."""
    try:
        length = int.from_bytes(data[len(MAGIC):len(MAGIC) + 4], "little")
        clear = data[:len(MAGIC) + 4 + length]
        header = json.loads(clear[len(MAGIC) + 4:])
        cipher, key_id, nonce = header["cipher"], header["key_id"], bytes.fromhex(header["nonce"])
        version = header["version"]
        if header.get("format") != ENCRYPTED_FORMAT or not isinstance(version, int) or not isinstance(key_id, str):
            raise ValueError
    except (ValueError, TypeError, KeyError, AttributeError):
        raise UserError(f"'{path}' has a damaged encryption header: the file was changed or truncated.") from None
    if version > ENCRYPTED_VERSION:
        raise UserError(f"'{path}' was encrypted by a newer rlspeed (encryption format {version}); upgrade rlspeed.")
    if cipher not in CIPHERS or len(nonce) != _NONCE_BYTES:
        raise UserError(f"'{path}' has a damaged encryption header (cipher {cipher!r}): the file was changed.")
    if key is None:
        raise KeyNeeded(f"'{path}' is encrypted ({cipher}); set {KEY_ENV} or {KEY_FILE_ENV} to its key.")
    if key.key_id != key_id:
        raise KeyNeeded(f"'{path}' was encrypted with another key (key id {key_id}) than {key.source} "
                        f"(key id {key.key_id}).")
    if len(key.secret) not in _KEY_BYTES[cipher]:
        raise UserError(f"'{path}' has a damaged encryption header: {cipher} does not take {key.source}'s "
                        f"{len(key.secret)}-byte key.")
    aead = _aead(cipher, key, path)
    try:
        return aead.decrypt(nonce, data[len(clear):], clear)
    except _AuthenticationFailed:
        raise UserError(f"'{path}' fails {cipher} authentication with the right key: the file was changed or "
                        "damaged after it was written.") from None


def _metadata_bytes(metadata: dict) -> bytes:
    """The metadata as the digest sees it: canonical JSON without the digest itself."""
    body = {key: value for key, value in metadata.items() if key != "digest"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def tensor_digest(tensors: dict[str, torch.Tensor], metadata: dict, algorithm: str = "sha256") -> str:
    """The hex digest of `tensors` (name, dtype, shape and bytes of each, in name order) and of `metadata` (less its
    `digest` entry), as stored in a checkpoint's metadata and checked by `load_checkpoint`."""
    hasher = _hasher(algorithm)
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        hasher.update(f"{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        if tensor.numel():
            hasher.update(tensor.reshape(-1).view(torch.uint8).numpy())
    hasher.update(_metadata_bytes(metadata))
    return hasher.hexdigest()


#: when this module was imported: a temporary file with this process's id made before then is a killed process's (a
#: container's process often has the id of the one before it); this process's own are newer
_STARTED = time.time()


def _temporary_files(path: Path) -> list[Path]:
    """Temporary files of interrupted writes of `path` (`save_checkpoint`'s `.{name}.{pid}.{random}.tmp`, no other
    file) whose writing process is gone (a running writer's file is kept: its name holds the writer's process id)."""
    stale = []
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        parts = tmp.name[len(path.name) + 2:-len(".tmp")].split(".")
        if len(parts) != 2 or not parts[0].isdigit() or not parts[1]:
            continue  # (not a name save_checkpoint makes: someone else's file)
        pid = int(parts[0])
        if pid != os.getpid():
            if process_running(pid):
                continue  # that process still runs (or may): it may be writing this file now
        elif pid == os.getpid() and _modified_since_start(tmp):
            continue
        stale.append(tmp)
    return stale


def _modified_since_start(tmp: Path) -> bool:
    """Whether `tmp` was written since this process started (or is gone): one of this process's own writes."""
    try:
        return tmp.stat().st_mtime >= _STARTED - 1.0  # (a second's slack for filesystem clocks)
    except OSError:
        return True


def remove_stale_temporary_files(path: str | os.PathLike) -> list[Path]:
    """Delete what interrupted writes of the checkpoint `path` left behind; returns the files removed. Writing only
    (`save_checkpoint`): a load deletes nothing, and on storage several machines share, another machine's writer (its
    process id unknown here) would lose the file it is writing."""
    removed = []
    for tmp in _temporary_files(checkpoint_path(path)):
        with contextlib.suppress(OSError):  # (gone already, or a directory this process may only read)
            tmp.unlink()
            removed.append(tmp)
    return removed


#: safetensors' names of the dtypes `_streamed_safetensors` writes (a checkpoint of another goes through its `save`),
#: in the order its files hold them
_SAFETENSORS_DTYPES = {torch.int64: "I64", torch.float64: "F64", torch.float32: "F32", torch.int32: "I32",
                       torch.bfloat16: "BF16", torch.float16: "F16", torch.int16: "I16", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}
_DTYPE_ORDER = {dtype: rank for rank, dtype in enumerate(_SAFETENSORS_DTYPES)}


def _streamed_safetensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> list | None:
    """The safetensors file of `tensors` (contiguous, on the CPU) and `metadata` as the pieces to write one after the
    other: its header, then each tensor's bytes as a view of its own memory (no copy). The same bytes as
    `safetensors.torch.save` (tensors in its order: by dtype, then by name; the header's compact JSON padded with
    spaces to a multiple of 8 bytes). None for a dtype it does not name, or on a big-endian machine (safetensors
    stores little-endian values): `save` writes those."""
    if sys.byteorder != "little" or any(tensor.dtype not in _SAFETENSORS_DTYPES for tensor in tensors.values()):
        return None
    names = sorted(tensors, key=lambda name: (_DTYPE_ORDER[tensors[name].dtype], name))
    entries, offset = {"__metadata__": metadata}, 0
    for name in names:
        tensor = tensors[name]
        entries[name] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                         "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    text = json.dumps(entries, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    pieces = [len(text).to_bytes(8, "little") + text]
    for name in names:
        if tensors[name].numel():
            pieces.append(tensors[name].reshape(-1).view(torch.uint8).numpy())
    return pieces


def save_checkpoint(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict,
                    digest: str | None = None, key: bytes | str | None = None, cipher: str | None = None) -> Path:
    """Write `tensors` and JSON-serialisable `metadata` to `checkpoint_path(path)` atomically (temp file, fsync,
    rename); returns that path.

    The metadata gets a `digest` entry ({"algorithm", "value"}: `digest` is "sha256" or "sm3", by default
    `RLSPEED_CHECKPOINT_DIGEST`'s, else "sha256"; `checkpoint_digest`) that `load_checkpoint` checks. A write that
    fails (a full disk, a file-size limit, no permission) is a UserError and leaves an existing checkpoint at `path`
    as it was.

    With a key (`key`, else `RLSPEED_CHECKPOINT_KEY` or `RLSPEED_CHECKPOINT_KEY_FILE`; see `encryption_key`) the file
    is encrypted with `cipher` (else `RLSPEED_CHECKPOINT_CIPHER`, else "aes-gcm"; see CIPHERS). A cipher asked for
    without a key is a UserError rather than a file written in clear.
    """
    path = checkpoint_path(path)
    digest = checkpoint_digest(digest)
    encryption = encryption_key(key)
    if encryption is None:
        _refuse_cipher_without_key(cipher)
    cipher = _cipher_name(cipher, encryption) if encryption is not None else None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"Cannot write the checkpoint '{path}': {error.strerror or error}.") from None
    remove_stale_temporary_files(path)
    with training_threads():  # (the copies: not on torch's threads, which a process forked later would hang on)
        cpu = {name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()}
    header = json.loads(json.dumps({"format": FORMAT, "version": FORMAT_VERSION, **metadata}))  # as load reads it
    header["digest"] = {"algorithm": digest, "value": tensor_digest(cpu, header, digest)}
    # A file in clear is written tensor by tensor from their own memory: a replay buffer's checkpoint took twice the
    # buffer's size in memory besides it (a copy of each tensor, then the whole file as one bytes object).
    streamed = _streamed_safetensors(cpu, {"rlspeed": json.dumps(header)}) if encryption is None else None
    payload = None
    if streamed is None:
        seen: set[int] = set()
        for name, tensor in cpu.items():
            # safetensors refuses tensors that share memory: views of one flat buffer, one tensor under two names.
            if tensor.untyped_storage().data_ptr() in seen or tensor.untyped_storage().nbytes() != tensor.nbytes:
                with training_threads():
                    cpu[name] = tensor = tensor.clone()
            seen.add(tensor.untyped_storage().data_ptr())
        payload = st_save(cpu, metadata={"rlspeed": json.dumps(header)})
        if encryption is not None:
            payload = _encrypt(payload, encryption, cipher, path)
    # (the header's bytes, then each tensor's as a flat uint8 array)
    _check_free_space(path, len(payload) if streamed is None else sum(len(part) for part in streamed))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            for part in [payload] if streamed is None else streamed:
                handle.write(part)
            handle.flush()
            os.fsync(handle.fileno())
        plain_file_mode(tmp)
        os.replace(tmp, path)
        tmp = None
    except OSError as error:
        raise UserError(f"Cannot write the checkpoint '{_unstaged(path)}' ({error.strerror or error}); "
                        f"{_what_stays(path)}.") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    # (the rename on disk too; Windows opens no directory, and some filesystems refuse a directory's fsync, EINVAL:
    # the file's was done)
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return path


def _what_stays(path: Path) -> str:
    """What a checkpoint write to `path` that failed leaves there, said of the file it is written for (a file staged
    beside a checkpoint, its replay buffer, is named as that file: the staged name is an inner detail)."""
    return ("an earlier checkpoint there is unchanged" if _unstaged(path).exists()
            else "nothing was written there (no earlier file of that name exists)")


def _check_free_space(path: Path, needed: int) -> None:
    """UserError, before anything is written, where the disk holding `path` has less room than the `needed` bytes of
    its new file: a replay buffer's file (7.6 GB for a full 1,000,000-transition Atari buffer) is written beside the
    one it replaces, which stays until the new one is whole, and a write that ran out of space filled the disk (other
    writers, metrics.csv say, then failed) before it was refused."""
    free = free_disk_bytes(path.parent)
    if free is not None and needed > free:  # (a file system that does not say: the write itself finds out)
        raise UserError(f"Cannot write the checkpoint '{_unstaged(path)}': it needs {size_text(needed, exact=True)} "
                        f"and the disk holding it has {size_text(free, exact=True)} free; {_what_stays(path)}.")


def load_checkpoint(path: str | os.PathLike, device: torch.device | str = "cpu", verify: bool = True,
                    allow_nonfinite: bool = False, key: bytes | str | None = None,
                    mapped: bool = False) -> tuple[dict[str, torch.Tensor], dict]:
    """Read a checkpoint written by `save_checkpoint` (`path` as given, or `checkpoint_path(path)` when `path` does
    not exist); returns (tensors on `device`, metadata).

    UserError naming the file when it is not a readable rlspeed checkpoint, when its digest does not match its
    contents (`verify=False` skips that check), when a model's metadata lacks what loading needs, or when a tensor
    holds NaN or infinite values (`allow_nonfinite=True` accepts them).

    An encrypted checkpoint is decrypted with `key`, else the environment's (see `encryption_key`), and authenticated
    whatever `verify` says; without a key, with another key, or when authentication fails: a UserError naming the
    file. Checkpoints in clear load whether or not a key is set.

    `mapped`: tensors on the CPU of a file in clear are views of the file mapped in memory (copied where written to),
    which take no memory of their own: for a caller that copies them elsewhere at once (a replay buffer that its
    checkpoint fills) and drops them before the file is replaced (Windows refuses to replace a mapped file).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise UserError(f"A checkpoint is read from a file: give its path (a str or pathlib.Path), not {path!r}.")
    given = path
    path = local_path(path)
    if not path.exists():
        zipped = path.with_name(path.name + ".zip")  # (Stable-Baselines3's save("name") writes name.zip)
        path = zipped if zipped.is_file() and not checkpoint_path(path).exists() else checkpoint_path(path)
    if not path.exists():
        ours = Path(given).expanduser().with_suffix(".safetensors")
        if str(given).endswith(".zip") and ours.is_file():  # (a ported SB3 script's load("best_model.zip"))
            raise UserError(f"Checkpoint '{given}' does not exist: rlspeed saves '{ours}' there, not "
                            "Stable-Baselines3's .zip; load that (or the name without an extension).")
        also = f" (nor '{path}')" if str(path) != str(given) and not str(given).endswith(("/", os.sep)) else ""
        raise UserError(f"Checkpoint '{given}' does not exist{also}.")
    refuse_irregular_file(path, f"The checkpoint '{path}'", "a checkpoint file")
    # A file in clear is read tensor by tensor (`_read_mapped`): read whole, then parsed, it took twice its size in
    # memory (a replay buffer's: besides the buffer it fills). Anything it does not read goes the way that names why.
    # (tensors for another device are copied there from the mapping: their own memory, none of the host's)
    read = _read_mapped(path, copy=not mapped and torch.device(device).type == "cpu")
    if read is not None:
        tensors, metadata = read
    else:
        try:
            data = path.read_bytes()
        except OSError as error:
            raise UserError(f"Cannot read the checkpoint '{path}': {error.strerror or error}.") from None
        if data.startswith(MAGIC):
            data = _decrypt(path, data, encryption_key(key))
        _refuse_exported(path)
        if data.startswith(b"PK\x03\x04"):  # (a zip archive: what Stable-Baselines3's and PyTorch's save() write)
            raise UserError(f"'{path}' is a zip archive (a Stable-Baselines3 model or a torch.save file), not an "
                            "rlspeed checkpoint; rlspeed reads the .safetensors files its own save() writes.")
        try:
            with training_threads():  # (the copies, as save's)
                tensors = st_load(data)
            header_len = int.from_bytes(data[:8], "little")
            header = json.loads(data[8:8 + header_len])
            metadata = json.loads(header.get("__metadata__", {}).get("rlspeed", "{}"))
        except (SafetensorError, ValueError, AttributeError, json.JSONDecodeError) as error:
            if data[:1] == b"\x80" and data[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):  # (pickle's PROTO opcode)
                raise UserError(f"'{path}' is a pickle (Stable-Baselines3's save_replay_buffer and VecNormalize.save "
                                "write one, as does pickle.dump), not an rlspeed checkpoint, and rlspeed never "
                                "unpickles a file (transitions from elsewhere go in through an "
                                "rlspeed.buffers.ReplayBuffer you fill: load_replay_buffer).") from None
            raise UserError(f"'{path}' is not an rlspeed checkpoint (its contents are not safetensors: {error}): "
                            "give a model file (.safetensors) that rlspeed wrote, or its run directory.") from None
        except RecursionError:
            metadata = None
    # (before anything walks it recursively: the digest, the checks, a load)
    if metadata is None or _nesting(metadata) > _MAX_NESTING:
        raise UserError(f"'{path}' has metadata nested deeper than any rlspeed writes: the file was edited or "
                        "damaged.")
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise UserError(f"'{path}' is a safetensors file but not an rlspeed checkpoint.")
    version = metadata.get("version", 0)
    if not isinstance(version, int):
        raise UserError(f"'{path}' has an unreadable format version {version!r}: the file is damaged.")
    if version > FORMAT_VERSION:
        raise UserError(f"'{path}' was written by a newer rlspeed (format {metadata['version']}); upgrade rlspeed.")
    if verify:
        _verify_digest(path, tensors, metadata)
    if "algo" in metadata:
        check_model_metadata(path, metadata)
    if not allow_nonfinite:
        _check_finite(path, tensors)
    if torch.is_inference_mode_enabled():
        # (read inside a caller's torch.inference_mode() they are inference tensors, which the optimizer state and
        # statistics a model takes from them are: no learn outside the block could update them in place)
        with torch.inference_mode(False):
            return {name: t.to(device).clone() for name, t in tensors.items()}, metadata
    return {name: t.to(device) for name, t in tensors.items()}, metadata


def _read_mapped(path: Path, copy: bool = True) -> tuple[dict[str, torch.Tensor], dict] | None:
    """(tensors, rlspeed metadata) of a safetensors file in clear, read from the file mapped in memory (safetensors'
    `safe_open`), each tensor with `copy` copied into memory of its own (nothing stays tied to the file, which a later
    save replaces), else a view of the mapping; None where it is not one that reads so (encrypted, a zip archive,
    damaged, metadata that is no JSON object)."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(len(MAGIC))
        if start.startswith((MAGIC, b"PK\x03\x04")):
            return None
        tensors = {}
        with safe_open(str(path), framework="pt") as handle:
            metadata = json.loads((handle.metadata() or {}).get("rlspeed", "{}"))
            if not isinstance(metadata, dict):
                return None
            with training_threads():  # (the copies, as save's)
                for name in handle.keys():
                    tensor = handle.get_tensor(name)
                    tensors[name] = tensor.clone() if copy else tensor
    except (OSError, SafetensorError, ValueError, RecursionError, AttributeError, RuntimeError):
        return None
    return tensors, metadata


#: Deeper than any metadata rlspeed writes nests its lists and objects (a Dict space of Box spaces with bounds of
#: several dimensions is under 10 levels); an edited file's deeper nesting would exhaust Python's recursion limit
_MAX_NESTING = 64


def _nesting(value) -> int:
    """How deep lists and dicts nest in `value` (JSON data), counted without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def replay_path(checkpoint: Path) -> Path:
    """The file the replay buffer saved with the checkpoint file `checkpoint` goes to (`REPLAY_SUFFIX`)."""
    return checkpoint.with_name(checkpoint.name[:-len(checkpoint.suffix)] + REPLAY_SUFFIX)


def staged_path(file: str | os.PathLike) -> Path:
    """Where a file that belongs to a checkpoint (a replay buffer beside it) is written first: `name.next.safetensors`
    beside `name.safetensors`. `commit_staged` moves it into place once the checkpoint naming it is written, so a kill
    in between leaves the previous checkpoint's pair whole; `load_paired` finds it where the kill came after the
    checkpoint's write."""
    file = Path(file)
    return file.with_name(file.name[:-len(SUFFIX)] + ".next" + SUFFIX)


def _unstaged(path: Path) -> Path:
    """The file that `path` is the staged name of (`staged_path`), else `path`."""
    staged = ".next" + SUFFIX
    return path.with_name(path.name[:-len(staged)] + SUFFIX) if path.name.endswith(staged) else path


def save_with_staged(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict,
                     staged: str | None, digest: str | None = None) -> Path:
    """`save_checkpoint`, with the file `staged` (a name beside the checkpoint, its replay buffer's, written to its
    staged name first; None: none) moved into place once the checkpoint naming it is written, or removed where the
    checkpoint could not be written (a full disk: it pairs with no checkpoint, and it is as large as the replay
    buffer, on a disk without room; a kill leaves it, which `load_paired` takes where its token matches)."""
    try:
        written = save_checkpoint(path, tensors, metadata, digest=digest)
    except Exception:
        if staged is not None:
            with contextlib.suppress(OSError):
                staged_path(checkpoint_path(path).with_name(staged)).unlink(missing_ok=True)
        raise
    if staged is not None:
        commit_staged(written.with_name(staged))
    return written


def beside(path: str | os.PathLike, name) -> Path | None:
    """The file `name` in the directory of `path`, as a checkpoint's metadata names a file written beside it (its
    replay buffer); None where `name` is no plain file name (a path, `..`, empty): a file's metadata never names a
    place elsewhere."""
    name = str(name)
    separators = [os.sep, os.altsep or os.sep, "\0"]
    if name in ("", ".", "..") or any(separator in name for separator in separators):
        return None
    return Path(path).with_name(name)


def commit_staged(file: str | os.PathLike) -> None:
    """Move `staged_path(file)` into place as `file` (after the checkpoint that names it was written)."""
    staged = staged_path(file)
    if staged.exists():
        os.replace(staged, file)


def load_paired(file: str | os.PathLike, token: str | None, device: torch.device | str = "cpu",
                allow_nonfinite: bool = False, mapped: bool = False) -> tuple[dict[str, torch.Tensor], dict]:
    """`load_checkpoint(file)` for the file a checkpoint names with its `replay_buffer` `token`: where `file` is
    missing or holds another token and the staged one (`staged_path`) holds this token (a kill between the
    checkpoint's write and `commit_staged`), the staged one, moved into place first. The caller compares the tokens
    of what it gets; `mapped` as `load_checkpoint`'s."""
    file = Path(file)
    staged = staged_path(file)
    if not file.exists() and staged.is_file():
        commit_staged(file)
    tensors, meta = load_checkpoint(file, device=device, allow_nonfinite=allow_nonfinite, mapped=mapped)
    if (meta.get("replay_buffer") or {}).get("token") != token and staged.is_file():
        try:
            other = load_checkpoint(staged, device=device, allow_nonfinite=allow_nonfinite, mapped=mapped)
        except UserError:
            return tensors, meta
        if (other[1].get("replay_buffer") or {}).get("token") == token:
            del tensors  # (`file`'s, maybe mapped: replaced next)
            commit_staged(file)
            return other
    return tensors, meta


def _verify_digest(path: Path, tensors: dict[str, torch.Tensor], metadata: dict) -> None:
    digest = metadata.get("digest")
    if digest is None and metadata.get("version") == 1:
        warnings.warn(f"'{path}' was written before checkpoints carried a digest: its integrity is not checked "
                      "(a model file gets one when saved again: rlspeed.algos.base.Algorithm.load(path).save(path)).",
                      stacklevel=3)
        return
    if digest is None:
        raise UserError(f"'{path}' carries no digest, so its integrity cannot be checked; {_unverified(metadata)} if "
                        "you trust it.")
    if not (isinstance(digest, dict) and digest.get("algorithm") in DIGESTS and isinstance(digest.get("value"), str)):
        raise UserError(f"'{path}' has an unreadable digest entry {digest!r}: the file is damaged.")
    if tensor_digest(tensors, metadata, digest["algorithm"]) != digest["value"]:
        raise UserError(f"'{path}' does not match its {digest['algorithm'].upper()} digest: the file was changed or "
                        f"damaged after it was written; {_unverified(metadata)} only if you trust its contents.")


def _unverified(metadata: dict) -> str:
    """How to read the file `metadata` describes without checking its digest, by the kind of file it is."""
    if "replay_buffer" in metadata and "algo" not in metadata:
        return "delete it (the replay buffer refills as training goes on)"
    if isinstance(metadata.get("population"), dict):
        return "resume it in Python with population.resume(path, verify=False)"
    saved = str(metadata.get("class") or "")  # (rlspeed's algorithms are top-level names; a subclass, its own)
    name = (f"rlspeed.{saved.rpartition('.')[2]}" if saved.startswith("rlspeed.algos.")
            else saved or "rlspeed.algos.base.Algorithm")
    return f"load it in Python with {name}.load(path, verify=False)"


def _check_finite(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    with training_threads():  # (as save's copies)
        bad = [name for name, tensor in tensors.items()
               if (tensor.is_floating_point() or tensor.is_complex()) and not bool(torch.isfinite(tensor).all())]
    if bad:
        shown = ", ".join(sorted(bad)[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise UserError(f"'{path}' holds NaN or infinite values (in {shown}): the run it comes from diverged; "
                        "load it with allow_nonfinite=True to inspect it anyway.")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shape_ok(value) -> bool:
    return isinstance(value, list) and all(_is_int(v) and v >= 0 for v in value)


def _bounds_ok(value) -> bool:
    """A Box bound as JSON: a number, null (an unbounded entry, as `rlspeed.envs.base` writes infinities) or (nested)
    lists of them (older files hold infinities as Python's json writes them, which it reads back as floats)."""
    if isinstance(value, list):
        return all(_bounds_ok(v) for v in value)
    return value is None or (_is_number(value) and not (isinstance(value, float) and math.isnan(value)))


def _action_space_problem(space) -> str | None:
    if not isinstance(space, dict):
        return "action_space is not an object"
    if space.get("type") == "discrete":
        return None if _is_int(space.get("n")) and space["n"] >= 1 else "a discrete action_space needs n >= 1"
    if space.get("type") == "box":
        for key in ("shape", "low", "high"):
            if key not in space:
                return f"the box action_space has no '{key}'"
        if not _shape_ok(space["shape"]):
            return "the box action_space's shape is not a list of sizes"
        if not (_bounds_ok(space["low"]) and _bounds_ok(space["high"])):
            return "the box action_space's low/high are not numbers"
        if "dtype" in space and not isinstance(space["dtype"], str):
            return "the box action_space's dtype is not a name"
        return None
    if space.get("type") == "multi_discrete":
        nvec = space.get("nvec")
        flat = _flat(nvec) if isinstance(nvec, list) else []
        ok = bool(flat) and all(_is_int(v) and v >= 1 for v in flat)
        return None if ok else "a multi_discrete action_space needs nvec, a list of sizes >= 1"
    if space.get("type") == "multi_binary":
        n = space.get("n")
        ok = (_is_int(n) and n >= 1) or (isinstance(n, list) and bool(n) and all(_is_int(v) and v >= 1 for v in n))
        return None if ok else "a multi_binary action_space needs n >= 1"
    return f"action_space has unknown type {space.get('type')!r}"


#: More elements than any observation or action a checkpoint's metadata may describe (an edited file otherwise
#: allocates the space's bounds, 16 bytes an element: 37 GiB for a Box of 100,000 x 100,000; 4096 x 4096 RGB images
#: are 50M elements)
_MAX_ELEMENTS = 2**26


def _largest_shape(space) -> int:
    """The most elements of any shape inside a space's JSON (`space_to_json`: "shape" lists, nested "spaces")."""
    if isinstance(space, list):
        return max((_largest_shape(item) for item in space), default=0)
    if not isinstance(space, dict):
        return 0
    shape = space.get("shape")
    own = math.prod(shape) if isinstance(shape, list) and all(_is_int(v) and v >= 0 for v in shape) else 0
    spaces = space.get("spaces")
    inner = _largest_shape(list(spaces.values()) if isinstance(spaces, dict) else spaces)
    return max(own, inner)


def _flat(values) -> list:
    """A nested list of numbers as one flat list (MultiDiscrete's nvec may have several dimensions)."""
    return [v for item in values for v in (_flat(item) if isinstance(item, list) else [item])]


def check_model_metadata(path: str | os.PathLike, metadata: dict) -> None:
    """UserError naming `path` unless a model checkpoint's metadata has what `Algorithm.load` reads, of the right
    kinds (algo, env_id, config, observation_shape, action_space, optimizers, num_timesteps, ...)."""
    problem = None
    required = {"algo": str, "env_id": str, "config": dict, "observation_shape": list, "action_space": dict}
    for key, kind in required.items():
        if key not in metadata:
            problem = f"it has no '{key}'"
            break
        if not isinstance(metadata[key], kind):
            problem = f"'{key}' is not a {kind.__name__}"
            break
    if problem is None:
        optional = {"num_timesteps": _is_int, "n_updates": _is_int, "seed": lambda v: v is None or _is_int(v),
                    "env_backend": lambda v: isinstance(v, str), "optimizers": lambda v: isinstance(v, dict),
                    "gym_packages": lambda v: isinstance(v, list) and all(isinstance(m, str) for m in v),
                    "max_episode_steps": lambda v: v is None or _is_int(v),
                    "env_kwargs": lambda v: v is None or isinstance(v, dict),
                    "env_kwargs_tuples": lambda v: isinstance(v, list) and all(
                        isinstance(p, list) and all(isinstance(k, (str, int)) for k in p) for p in v),
                    "reward_threshold": lambda v: v is None or _is_number(v),
                    "schedule": lambda v: v is None or (isinstance(v, list) and len(v) == 2
                                                        and all(_is_number(x) for x in v))}
        for key, ok in optional.items():
            if key in metadata and not ok(metadata[key]):
                problem = f"'{key}' has an unreadable value {metadata[key]!r}"
                break
    if problem is None and not _shape_ok(metadata["observation_shape"]):
        problem = "'observation_shape' is not a list of sizes"
    if problem is None and math.prod(metadata["observation_shape"]) > _MAX_ELEMENTS:
        problem = f"'observation_shape' {metadata['observation_shape']} is larger than any observation"
    for key in ("observation_space", "action_space"):  # (before a space is built: its bounds are allocated)
        if problem is None and _largest_shape(metadata.get(key)) > _MAX_ELEMENTS:
            problem = f"'{key}' holds a shape larger than any observation or action"
    if problem is None and "observation_space" in metadata:
        from rlspeed.envs.base import space_from_json

        try:
            space_from_json(metadata["observation_space"])
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            problem = "'observation_space' is not a space rlspeed wrote"
    if problem is None:
        problem = _action_space_problem(metadata["action_space"])
    if problem is None:
        for name, groups in metadata.get("optimizers", {}).items():
            if not (isinstance(groups, list) and all(isinstance(g, dict) and isinstance(g.get("params"), list)
                                                     for g in groups)):
                problem = f"the state of optimizer '{name}' is unreadable"
                break
    if problem is not None:
        raise UserError(f"'{path}' is not a usable model checkpoint: {problem} (the file was edited or damaged).")


def _refuse_exported(path: Path) -> None:
    """UserError for a file that `rlspeed export` wrote (its sidecar `FILE.json` names its format and algorithm), which
    rlspeed does not load back: the sentence names the model file to give instead and what runs an exported one."""
    try:
        sidecar = json.loads(path.with_name(path.name + ".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(sidecar, dict) and sidecar.get("format") in ("onnx", "torchscript", "exported_program") and \
            "algo" in sidecar:
        kind = {"onnx": "an ONNX", "torchscript": "a TorchScript", "exported_program": "a torch.export"}
        raise UserError(f"'{path}' is {kind[sidecar['format']]} model that rlspeed export wrote (its sidecar "
                        f"'{path.name}.json'), which rlspeed does not load back: give the model file (.safetensors) "
                        "or run directory it was exported from; an exported model runs in onnxruntime or torch "
                        "(docs/export.md).")


def refuse_non_model(path, meta: dict, verb: str = "load") -> None:
    """UserError for a checkpoint file that holds no single model, given where one belongs: a replay buffer
    (`<name>.replay.safetensors`) or a population's checkpoint (`PopulationBase.save`); the message says what to
    give instead (`verb`: "load" or "resume")."""
    if "replay_buffer" in meta and "algo" not in meta:
        if isinstance(meta["replay_buffer"], dict) and "alive" in meta["replay_buffer"]:  # (a population's)
            what, model = "a population's", "one member's model, members/seed_<S>.safetensors in its run directory"
        else:
            what, model = "a", "the model file beside it (model.safetensors or checkpoint.safetensors)"
        raise UserError(f"'{path}' is {what} replay buffer (written beside a checkpoint by --save-replay-buffer), not "
                        f"a model: give {model}.")
    population = meta.get("population")
    if not isinstance(population, dict):
        return
    seeds = ",".join(str(seed) for seed in population.get("seeds", []))
    advice = (f"resume it as a population (rlspeed train ... --seeds {seeds} --resume)" if verb == "resume" else
              "load one member's model from the run directory's members/seed_<S>.safetensors (written when the "
              "population finishes or is interrupted)")
    raise UserError(f"'{path}' is the checkpoint of a population ({population.get('algo')} on "
                    f"{population.get('env_id')}, seeds {seeds}), not of one model: {advice}.")
