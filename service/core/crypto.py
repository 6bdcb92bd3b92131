"""Encryption at rest for function secrets and registry passwords (Fernet: AES-128-CBC + HMAC),
and the keys derived from the same secret (`SecretBox.derive`: invocation tokens)."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from service.core.settings import Settings


class SecretBox:
    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)
        self._key = key

    def derive(self, purpose: str) -> bytes:
        """A 32-byte key for one purpose (HKDF-SHA256 over this key): the same on every
        replica sharing the key, unrelated to the encryption key and to other purposes."""
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose.encode())
        return hkdf.derive(self._key)

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def decrypt(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode()).decode()
        except InvalidToken:
            raise ValueError("secret cannot be decrypted with the configured key") from None

    def __repr__(self) -> str:
        return "SecretBox(<key hidden>)"


def load_secret_box(settings: Settings) -> SecretBox:
    """The configured key, or one generated once into the data dir (mode 0600)."""
    if settings.secrets_key is not None:
        raw = settings.secrets_key.get_secret_value().encode()
        try:
            return SecretBox(raw)
        except ValueError:
            raise ValueError(
                "NVCF_SECRETS_KEY must be 32 url-safe base64-encoded bytes (a Fernet key)"
            ) from None
    path = Path(settings.data_dir) / "secrets.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(Fernet.generate_key())
        try:
            # link() fails if another process won the race; then its key is the key.
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return SecretBox(path.read_bytes().strip())
