"""Who wrote a pack: Ed25519 signatures over a pack's manifest.

A compile cache is code: inductor and AOTAutograd entries are pickles torch loads, kernels are
shared objects it maps. The sha256 of every file in the manifest guards against damage, not
against whoever wrote the pack; a signature over the manifest's exact bytes (which hold those
hashes) ties every file to a key. Ed25519, not an HMAC: verifiers hold only public keys, so a
machine that checks packs cannot forge one (with a shared secret every verifier could).

Keys: ``keygen`` writes the private key (PEM, PKCS#8, mode 0600) and ``KEYFILE.pub``, one line
``torchrepro-ed25519 <base64 of the 32 raw bytes>``. A signed pack holds
``torchrepro-pack.sig`` right after its manifest: JSON with the public key and the signature,
both base64. A key is read only from a regular file (a FIFO or a device is refused, never waited
on); a private key others can read and a trusted public key others can write are refused, with the
``chmod`` that fixes them (:func:`read_key`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
from pathlib import Path
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import InputError

SIGNATURE = "torchrepro-pack.sig"
SIGNATURE_SCHEMA = "torchrepro.cache-pack-signature/1"
KEY_PREFIX = "torchrepro-ed25519"
TRUSTED_VAR = "TORCHREPRO_TRUSTED_KEYS"  # a path list (os.pathsep) of .pub files
_KEY_LIMIT = 64 << 10


if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def read_key(path: Path, what: str, *, private: bool) -> bytes:
    """The bytes of the key file ``path`` (at most 64 KiB), ``what`` naming it in errors: an
    :class:`InputError` for anything but a regular file (opened without waiting: a FIFO is refused,
    not read), for a ``private`` key that group or others may read (``chmod 600``) and for a public
    key that group or others may write (anyone could put their key among the trusted: ``chmod 644``)."""
    from ..eventlog.event_reader import open_regular

    try:
        fp = open_regular(path)
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except InputError:
        raise InputError(
            f"{what} {path} is not a regular file (a FIFO, a device or a directory): give the key file"
        ) from None
    with fp:
        mode = os.fstat(fp.fileno()).st_mode
        if private and mode & 0o077:
            raise InputError(f"{what} {path} can be read by others (mode {stat.S_IMODE(mode):o}): chmod 600 {path}")
        if not private and mode & 0o022:
            raise InputError(
                f"{what} {path} can be written by others (mode {stat.S_IMODE(mode):o}), who could add their "
                f"key: chmod 644 {path}"
            )
        try:
            return fp.read(_KEY_LIMIT)
        except OSError as exc:
            raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def fingerprint(raw: bytes) -> str:
    """``SHA256:<base64>`` of a raw public key, as ``ssh-keygen -l`` shows keys."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def _raw_public(key: Ed25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def keygen(keyfile: str | os.PathLike[str]) -> tuple[Path, Path, str]:
    """Write a new private key to ``keyfile`` (mode 0600) and its public key to ``keyfile.pub``;
    returns both paths and the fingerprint. Refuses (:class:`InputError`) if either exists."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    private = Path(keyfile).absolute()
    public = private.with_name(private.name + ".pub")
    for path in (private, public):
        if os.path.lexists(path):
            raise InputError(f"{path} exists: keygen never overwrites a key (choose another name)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    raw = _raw_public(key)
    written = []
    try:
        for path, data, mode in ((private, pem, 0o600), (public, public_line(raw).encode(), 0o644)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            written.append(path)
            with os.fdopen(fd, "wb") as fp:
                fp.write(data)
    except OSError as exc:
        for path in written:
            path.unlink(missing_ok=True)
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    return private, public, fingerprint(raw)


def public_line(raw: bytes) -> str:
    """The one-line form of a public key, as ``KEYFILE.pub`` holds it."""
    return f"{KEY_PREFIX} {base64.b64encode(raw).decode()}\n"


def _b64(text: object, what: str, size: int) -> bytes:
    try:
        data = base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        data = b""
    if len(data) != size:
        raise ValueError(f"{what} is not {size} bytes of base64")
    return data


def sign(manifest: bytes, keyfile: str | os.PathLike[str]) -> bytes:
    """The ``torchrepro-pack.sig`` member for ``manifest`` (its exact bytes), signed with the
    private key in ``keyfile``."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    path = Path(keyfile)
    try:
        key = load_pem_private_key(read_key(path, "signing key", private=True), password=None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"{path} is not an unencrypted Ed25519 private key (make one with torchrepro cache keygen)")
    document = {
        "schema": SIGNATURE_SCHEMA,
        "algorithm": "ed25519",
        "public_key": base64.b64encode(_raw_public(key)).decode(),
        "signature": base64.b64encode(key.sign(manifest)).decode(),
    }
    return json.dumps(document, indent=1).encode()


def signer(manifest: bytes, signature: bytes, where: str) -> str:
    """The fingerprint of the key whose signature over ``manifest`` the ``signature`` member
    holds; :class:`InputError` if the signature is unreadable or does not match the bytes."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        document = json.loads(signature)
        if document.get("schema") != SIGNATURE_SCHEMA or document.get("algorithm") != "ed25519":
            raise ValueError(f"schema {document.get('schema')!r}")
        raw = _b64(document["public_key"], "the public key", 32)
        sig = _b64(document["signature"], "the signature", 64)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{where}: unreadable {SIGNATURE} ({' '.join(str(exc).split())[:200]})") from None
    try:
        Ed25519PublicKey.from_public_bytes(raw).verify(sig, manifest)
    except InvalidSignature:
        raise InputError(f"{where}: the signature does not match the manifest (altered after signing)") from None
    return fingerprint(raw)


def trusted_keys(paths: Iterable[str | os.PathLike[str]] | None = None) -> dict[str, str]:
    """Fingerprint -> file of the public keys in ``paths`` (default: the files ``TORCHREPRO_TRUSTED_KEYS``
    lists); :class:`InputError` for a file that is missing or holds no torchrepro public key."""
    if paths is None:
        paths = [p for p in os.environ.get(TRUSTED_VAR, "").split(os.pathsep) if p]
    keys = {}
    for path in map(Path, paths):
        text = read_key(path, "trusted key", private=False).decode("utf-8", "replace")
        found = 0
        for line in text.splitlines():
            kind, _, b64 = line.strip().partition(" ")
            if kind != KEY_PREFIX:
                continue
            try:
                keys[fingerprint(_b64(b64.strip(), "the key", 32))] = str(path)
                found += 1
            except ValueError:
                break
        if not found:
            raise InputError(f"{path} holds no '{KEY_PREFIX} <base64>' public key (the .pub that keygen writes)")
    return keys
