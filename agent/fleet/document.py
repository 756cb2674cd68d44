"""The signed fleet document and its keys.

A document is JSON: `{"version", "issued_at", "expires_at"?, "target", "patch", "reset"?,
"key_id", "signature"}`. The signature is Ed25519 over the document's canonical bytes: the
JSON of every field but `signature`, keys sorted, no whitespace, UTF-8. Canonical bytes make
the signature independent of how a tool formats the JSON on the wire, and any change to a
signed field (a tampered patch, a moved target, a later expiry) breaks it.

Keys: the private key is a PKCS#8 PEM file kept by the operator (`agentctl fleet keygen`);
devices trust the public keys in `fleet.trusted_keys_dir`, one `<key_id>.pub` PEM file each.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipelines.bounded_json import JsonRejected, parse_json

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "DocumentError",
    "FleetDocument",
    "canonical_bytes",
    "generate_key",
    "load_private_key",
    "load_trusted_keys",
    "parse_document",
    "sign_document",
    "verify_signature",
]

MAX_DOCUMENT_BYTES = 64 << 10  # larger payloads are refused before they are parsed

KEY_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_KEY_ID = re.compile(KEY_ID)


class DocumentError(Exception):
    """A document refused before it is applied; `reason` is the acknowledgement's reason
    code (unsigned, unknown_key, bad_signature, invalid_document, ...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class FleetDocument(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=1, description="Monotonic per target.")
    issued_at: float = Field(description="Epoch seconds.")
    expires_at: float | None = Field(None, description="Epoch seconds; refused after it.")
    target: str = Field(
        pattern=r"^fleet/(device/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="fleet/<group> or fleet/device/<device_id>.",
    )
    patch: dict[str, Any] = Field(default_factory=dict)
    reset: list[str] = Field(default_factory=list, description="JSON pointers.")
    key_id: str = Field(pattern=KEY_ID)
    signature: str


def canonical_bytes(doc: dict[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def parse_document(payload: bytes) -> tuple[FleetDocument, dict[str, Any]]:
    """The document and its raw JSON (what was signed). Raises DocumentError."""
    try:
        raw = parse_json(payload, max_bytes=MAX_DOCUMENT_BYTES)
    except JsonRejected as exc:
        raise DocumentError("invalid_document", f"not JSON we accept: {exc}") from exc
    if not isinstance(raw, dict):
        raise DocumentError("invalid_document", "not a JSON object")
    if not raw.get("signature") or not raw.get("key_id"):
        raise DocumentError("unsigned", "no signature or key_id")
    try:
        return FleetDocument.model_validate(raw), raw
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise DocumentError("invalid_document", f"{where}: {first['msg']}") from exc


def load_trusted_keys(folder: Path) -> dict[str, Any]:
    """key_id -> Ed25519 public key, from `<key_id>.pub` PEM files (unreadable ones are
    skipped and named in the error the caller logs)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    keys: dict[str, Any] = {}
    if not folder.is_dir():
        return keys
    for path in sorted(folder.glob("*.pub")):
        if not _KEY_ID.match(path.stem):
            continue
        try:
            key = load_pem_public_key(path.read_bytes())
        except (ValueError, OSError):
            continue
        if isinstance(key, Ed25519PublicKey):
            keys[path.stem] = key
    return keys


def verify_signature(raw: dict[str, Any], keys: dict[str, Any]) -> None:
    """Raises DocumentError(unknown_key | bad_signature)."""
    from cryptography.exceptions import InvalidSignature

    key = keys.get(str(raw.get("key_id")))
    if key is None:
        raise DocumentError("unknown_key", f"key {raw.get('key_id')!r} is not trusted here")
    try:
        signature = base64.b64decode(str(raw["signature"]), validate=True)
        key.verify(signature, canonical_bytes(raw))
    except (InvalidSignature, ValueError) as exc:
        raise DocumentError("bad_signature", "the signature does not match the document") from exc


def generate_key() -> tuple[bytes, bytes]:
    """(private PKCS#8 PEM, public SubjectPublicKeyInfo PEM) of a new Ed25519 key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


def load_private_key(path: Path) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    key = load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} is not an Ed25519 private key")
    return key


def sign_document(body: dict[str, Any], key: Any, key_id: str) -> dict[str, Any]:
    """`body` (version, issued_at, target, patch, ...) signed: a publishable document."""
    doc = {**body, "key_id": key_id}
    doc.pop("signature", None)
    signature = key.sign(canonical_bytes(doc))
    return {**doc, "signature": base64.b64encode(signature).decode()}
