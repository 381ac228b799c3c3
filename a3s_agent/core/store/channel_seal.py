"""Sealing the notifications between replicas (postgres_channel.py), so that only replicas read
and send them.

LISTEN and NOTIFY take no privilege: every role that may connect to the database may listen on any
channel and notify on it. Unsealed, such a role (a read-only reporting login, say) would read every
session's events and chunks as they stream, and could send control messages: approve a tool call
that waits for confirmation, inject a message into a run, cancel one. So each payload is sealed with
AES-256-GCM under a key in the table `channel_key`, which the migration fills from the server's
strong random source and grants to nobody (its owner and superusers read it). The channel's name is
sealed in too, so a payload does not open on the other channel. A sealed payload is ASCII: base64
of a random 12-byte nonce, the ciphertext and the 16-byte tag.
"""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE_BYTES = 12
TAG_BYTES = 16


def sealed_capacity(limit: int) -> int:
    """The most bytes of text whose sealed payload stays within `limit` bytes."""
    return limit // 4 * 3 - NONCE_BYTES - TAG_BYTES


class ChannelSeal:
    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, text: str, channel: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, text.encode(), channel.encode())
        return base64.b64encode(nonce + sealed).decode("ascii")

    def open(self, payload: str, channel: str) -> tuple[str, bytes] | None:
        """The text sealed for `channel` and its nonce; None for a payload that was not (anything
        another client sent, a replica of a version before the seal, a payload of the other channel)."""
        try:
            raw = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            return None
        nonce = raw[:NONCE_BYTES]
        try:
            text = self._aead.decrypt(nonce, raw[NONCE_BYTES:], channel.encode())
        except (InvalidTag, ValueError):
            return None
        try:
            return text.decode(), nonce
        except UnicodeDecodeError:
            return None
