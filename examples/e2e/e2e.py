#!/usr/bin/env python3
"""End-to-end encryption over Courier, as docs/e2e.md describes it.

Two users with two devices each: every device publishes its public keys; alice's phone
runs X3DH with each of bob's devices and with her own laptop through the key directory,
and the devices exchange messages through their mailboxes; then each user sets up a
sender key for a group, distributes it through the mailboxes, and posts encrypted
messages to the group that every other device decrypts. The server sees public keys and
ciphertext only.

Usage:  python3 examples/e2e/e2e.py http://127.0.0.1:8080 [--marker WORD] [--suffix S]
Needs:  Python 3.9+ and the `cryptography` package (pip install cryptography).

Every plaintext carries the marker, so a test can search the server's database for it.
A session here is X3DH followed by a chain of message keys (HKDF of the shared secret and
a counter) — enough to show what the server carries; a real client would continue with
the Double Ratchet. Exits 0 when every device decrypted everything meant for it.
"""

import argparse
import base64
import json
import os
import sys
import urllib.error
import urllib.request

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

ENCRYPTED = 10  # the content type of the `encrypted` kind
IDENTITY_CONTEXT = b"courier:identity-key:v1"
SIGNED_PREKEY_CONTEXT = b"courier:signed-prekey:v1"
LAST_RESORT_CONTEXT = b"courier:last-resort-prekey:v1"


def b64(data):
    return base64.b64encode(data).decode()


def unb64(text):
    return base64.b64decode(text, validate=True)


def raw(key):
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def hkdf(secret, info, salt=None):
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(secret)


class Api:
    """The few HTTP calls this example makes (docs/protocol.md)."""

    def __init__(self, base):
        self.base = base.rstrip("/")

    def call(self, method, path, token=None, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("content-type", "application/json")
        if token:
            req.add_header("authorization", "Bearer " + token)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raise SystemExit(f"{method} {path}: HTTP {e.code} {e.read().decode()}")

    def token(self, user, password):
        body = {"userId": user, "password": password}
        try:
            return self.call("POST", "/v1/auth/register", body=body)["token"]
        except SystemExit:
            return self.call("POST", "/v1/auth/login", body=body)["token"]


class Device:
    """One device: its private keys (never sent), its sessions and sender keys."""

    def __init__(self, api, user, token, device_id):
        self.api, self.user, self.token, self.id = api, user, token, device_id
        self.identity = X25519PrivateKey.generate()
        self.signing = Ed25519PrivateKey.generate()
        self.signed_prekey = (1, X25519PrivateKey.generate())
        self.last_resort = (1000, X25519PrivateKey.generate())
        self.one_time = {i: X25519PrivateKey.generate() for i in range(1, 6)}
        self.sessions = {}  # (user, device) -> {"key": bytes, "sent": n}
        self.sender_keys = {}  # (user, device) -> {"chain": bytes, "verify": key}
        self.received = []  # plaintexts, in order
        self.sent = 0

    def sign(self, context, *parts):
        return b64(self.signing.sign(context + b"".join(parts)))

    def publish(self):
        """Registers the device and uploads its public keys."""
        self.api.call("POST", "/v1/devices", self.token, {"deviceId": self.id})
        spk_id, spk = self.signed_prekey
        lr_id, lr = self.last_resort
        ik = raw(self.identity.public_key())
        body = {
            "identityKey": b64(ik),
            "signingKey": b64(raw(self.signing.public_key())),
            "identitySignature": self.sign(IDENTITY_CONTEXT, ik),
            "signedPrekey": {
                "keyId": spk_id,
                "publicKey": b64(raw(spk.public_key())),
                "signature": self.sign(
                    SIGNED_PREKEY_CONTEXT, spk_id.to_bytes(8, "big"), raw(spk.public_key())
                ),
            },
            "lastResortPrekey": {
                "keyId": lr_id,
                "publicKey": b64(raw(lr.public_key())),
                "signature": self.sign(
                    LAST_RESORT_CONTEXT, lr_id.to_bytes(8, "big"), raw(lr.public_key())
                ),
            },
            "oneTimePrekeys": [
                {"keyId": i, "publicKey": b64(raw(k.public_key()))}
                for i, k in self.one_time.items()
            ],
        }
        status = self.api.call("PUT", f"/v1/devices/{self.id}/keys", self.token, body)
        assert status["oneTimePrekeys"] == 5, status

    # --- X3DH ----------------------------------------------------------------------

    def start_sessions(self, user):
        """Claims a bundle of each of `user`'s devices and runs X3DH with each (but
        itself): the first message to each carries what the device needs to agree."""
        bundles = self.api.call("GET", f"/v1/keys/{user}", self.token)
        for b in bundles["devices"]:
            peer = (user, b["deviceId"])
            if peer == (self.user, self.id) or peer in self.sessions:
                continue
            signer = Ed25519PublicKey.from_public_bytes(unb64(b["signingKey"]))
            ik = unb64(b["identityKey"])
            spk = b["signedPrekey"]
            spk_key = unb64(spk["publicKey"])
            try:
                signer.verify(unb64(b["identitySignature"]), IDENTITY_CONTEXT + ik)
                signer.verify(
                    unb64(spk["signature"]),
                    SIGNED_PREKEY_CONTEXT + spk["keyId"].to_bytes(8, "big") + spk_key,
                )
                prekey = b["prekey"]
                if prekey["lastResort"]:
                    signer.verify(
                        unb64(prekey["signature"]),
                        LAST_RESORT_CONTEXT
                        + prekey["keyId"].to_bytes(8, "big")
                        + unb64(prekey["publicKey"]),
                    )
            except InvalidSignature:
                raise SystemExit(f"{user}/{b['deviceId']}: a bundle that does not verify")
            ephemeral = X25519PrivateKey.generate()
            dhs = [
                self.identity.exchange(X25519PublicKey.from_public_bytes(spk_key)),
                ephemeral.exchange(X25519PublicKey.from_public_bytes(ik)),
                ephemeral.exchange(X25519PublicKey.from_public_bytes(spk_key)),
                ephemeral.exchange(
                    X25519PublicKey.from_public_bytes(unb64(b["prekey"]["publicKey"]))
                ),
            ]
            secret = agree(dhs)
            self.sessions[(user, b["deviceId"])] = {
                "key": secret,
                "sent": 0,
                "hello": {
                    "ik": b64(raw(self.identity.public_key())),
                    "ek": b64(raw(ephemeral.public_key())),
                    "spk": spk["keyId"],
                    "pk": b["prekey"]["keyId"],
                    "lastResort": b["prekey"]["lastResort"],
                },
            }

    def accept(self, sender, header):
        """The responder's half of X3DH, from the first message's header."""
        ik = X25519PublicKey.from_public_bytes(unb64(header["ik"]))
        ek = X25519PublicKey.from_public_bytes(unb64(header["ek"]))
        assert header["spk"] == self.signed_prekey[0]
        spk = self.signed_prekey[1]
        if header["lastResort"]:
            prekey = self.last_resort[1]
        else:
            # A one-time prekey is used once: its private half goes now.
            prekey = self.one_time.pop(header["pk"])
        dhs = [
            spk.exchange(ik),
            self.identity.exchange(ek),
            spk.exchange(ek),
            prekey.exchange(ek),
        ]
        self.sessions[sender] = {"key": agree(dhs), "sent": 0}

    # --- pairwise messages through the mailboxes -------------------------------------

    def seal(self, to, plaintext):
        """The `encrypted` envelope of `plaintext` for device `to` (user, device)."""
        s = self.sessions[to]
        n = s["sent"]
        s["sent"] += 1
        nonce = os.urandom(12)
        header = {"n": n, "nonce": b64(nonce)}
        kind = "message"
        if "hello" in s:
            header.update(s.pop("hello"))
            kind = "prekey"
        aad = f"{self.user}/{self.id}>{to[0]}/{to[1]}".encode()
        key = message_key(s["key"], aad, n)
        ciphertext = ChaCha20Poly1305(key).encrypt(nonce, plaintext.encode(), aad)
        return {
            "v": 1,
            "type": kind,
            "senderDeviceId": self.id,
            "recipientDeviceId": to[1],
            "header": b64(json.dumps(header).encode()),
            "ciphertext": b64(ciphertext),
        }

    def send_to(self, targets, plaintext):
        """One send to several devices' mailboxes, each its own ciphertext."""
        self.sent += 1
        body = {
            "deviceId": self.id,
            "clientMsgId": f"{self.id}-{self.sent}-{os.urandom(4).hex()}",
            "contentType": ENCRYPTED,
            "messages": [
                {"userId": u, "deviceId": d, "payload": self.seal((u, d), plaintext)}
                for (u, d) in targets
            ],
        }
        ack = self.api.call("POST", "/v1/device-messages", self.token, body)
        assert len(ack["entries"]) == len(targets), ack

    def read_mailbox(self):
        """Pulls the mailbox, opens every entry, then acknowledges them (they go)."""
        page = self.api.call("GET", f"/v1/devices/{self.id}/mailbox?afterSeq=0", self.token)
        for e in page["entries"]:
            env = e["payload"]
            sender = (e["senderId"], e["senderDeviceId"])
            header = json.loads(unb64(env["header"]))
            if env["type"] == "prekey":
                self.accept(sender, header)
            aad = f"{sender[0]}/{sender[1]}>{self.user}/{self.id}".encode()
            key = message_key(self.sessions[sender]["key"], aad, header["n"])
            plaintext = ChaCha20Poly1305(key).decrypt(
                unb64(header["nonce"]), unb64(env["ciphertext"]), aad
            ).decode()
            self.opened(sender, plaintext)
        if page["entries"]:
            last = page["entries"][-1]["seq"]
            self.api.call(
                "POST", f"/v1/devices/{self.id}/mailbox/ack", self.token, {"seq": last}
            )
            again = self.api.call(
                "GET", f"/v1/devices/{self.id}/mailbox?afterSeq=0", self.token
            )
            assert again["entries"] == [], again

    def opened(self, sender, plaintext):
        if plaintext.startswith("{"):
            # A sender key for a group, sent pairwise.
            k = json.loads(plaintext)
            self.sender_keys[sender] = {
                "chain": unb64(k["chainKey"]),
                "verify": Ed25519PublicKey.from_public_bytes(unb64(k["signingKey"])),
                "group": k["conversationId"],
            }
        else:
            self.received.append(plaintext)

    # --- group messages under a sender key ------------------------------------------

    def make_sender_key(self, conversation_id, targets):
        """A fresh sender key, distributed to every other member device pairwise."""
        self.group_chain = os.urandom(32)
        self.group_signing = Ed25519PrivateKey.generate()
        self.group_sent = 0
        key = json.dumps(
            {
                "conversationId": conversation_id,
                "chainKey": b64(self.group_chain),
                "signingKey": b64(raw(self.group_signing.public_key())),
            }
        )
        self.send_to(targets, key)

    def post(self, conversation_id, plaintext):
        """One `encrypted` message in the group: one ciphertext for every member."""
        n = self.group_sent
        self.group_sent += 1
        key = hkdf(self.group_chain, b"courier-example-group" + n.to_bytes(8, "big"))
        nonce = os.urandom(12)
        ciphertext = ChaCha20Poly1305(key).encrypt(nonce, plaintext.encode(), None)
        signature = self.group_signing.sign(nonce + ciphertext)
        header = {"n": n, "nonce": b64(nonce), "sig": b64(signature)}
        payload = {
            "v": 1,
            "type": "message",
            "senderDeviceId": self.id,
            "header": b64(json.dumps(header).encode()),
            "ciphertext": b64(ciphertext),
        }
        self.sent += 1
        body = {
            "clientMsgId": f"{self.id}-group-{self.sent}-{os.urandom(4).hex()}",
            "conversationType": 2,
            "conversationId": conversation_id,
            "contentType": ENCRYPTED,
            "payload": payload,
        }
        self.api.call("POST", "/v1/messages", self.token, body)

    def read_group(self, conversation_id):
        """Pulls the group and opens every encrypted message from another device."""
        page = self.api.call(
            "GET", f"/v1/conversations/{conversation_id}/messages?afterSeq=0", self.token
        )
        for m in page["messages"]:
            if m["contentType"] != ENCRYPTED:
                continue
            env = m["payload"]
            sender = (m["senderId"], env["senderDeviceId"])
            if sender == (self.user, self.id):
                continue
            k = self.sender_keys[sender]
            header = json.loads(unb64(env["header"]))
            nonce, ciphertext = unb64(header["nonce"]), unb64(env["ciphertext"])
            k["verify"].verify(unb64(header["sig"]), nonce + ciphertext)
            key = hkdf(k["chain"], b"courier-example-group" + header["n"].to_bytes(8, "big"))
            self.received.append(
                ChaCha20Poly1305(key).decrypt(nonce, ciphertext, None).decode()
            )


def message_key(secret, direction, n):
    """The key of message `n` one way of a session."""
    return hkdf(secret, b"courier-example-message|" + direction + n.to_bytes(8, "big"))


def agree(dhs):
    """X3DH's shared secret: HKDF over 32 0xFF bytes and the four agreements."""
    return hkdf(b"\xff" * 32 + b"".join(dhs), b"courier-example-x3dh", salt=b"\x00" * 32)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("server", help="the server's base URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--marker", default="plaintext", help="a word every plaintext carries")
    p.add_argument("--suffix", default="", help="appended to the user ids")
    a = p.parse_args()
    api = Api(a.server)
    alice_id, bob_id = "alice" + a.suffix, "bob" + a.suffix
    alice = api.token(alice_id, "password-" + alice_id)
    bob = api.token(bob_id, "password-" + bob_id)
    devices = {
        "ap": Device(api, alice_id, alice, "phone"),
        "al": Device(api, alice_id, alice, "laptop"),
        "bp": Device(api, bob_id, bob, "phone"),
        "bl": Device(api, bob_id, bob, "laptop"),
    }
    for d in devices.values():
        d.publish()
    print("4 devices published their keys")

    ap, al, bp, bl = (devices[k] for k in ("ap", "al", "bp", "bl"))
    # Pairwise: alice's phone to bob's devices and her own laptop.
    ap.start_sessions(bob_id)
    ap.start_sessions(alice_id)
    hello = f"hello bob, {a.marker} one"
    ap.send_to([(bob_id, "phone"), (bob_id, "laptop"), (alice_id, "laptop")], hello)
    for d in (bp, bl, al):
        d.read_mailbox()
        assert d.received == [hello], (d.user, d.id, d.received)
    # bob's phone answers on the sessions alice's phone opened, and opens one to his
    # laptop.
    bp.start_sessions(bob_id)
    reply = f"hi alice, {a.marker} two"
    bp.send_to([(alice_id, "phone"), (bob_id, "laptop")], reply)
    ap.read_mailbox()
    bl.read_mailbox()
    assert ap.received == [reply], ap.received
    assert bl.received == [hello, reply], bl.received
    print("pairwise messages: every device decrypted what was sent to it")

    # A group with a sender key per sending device.
    group = api.call("POST", "/v1/groups", alice, {"name": "E2E", "members": [bob_id]})
    gid = group["conversationId"]
    ap.make_sender_key(gid, [(bob_id, "phone"), (bob_id, "laptop"), (alice_id, "laptop")])
    for d in (bp, bl, al):
        d.read_mailbox()
    ap.post(gid, f"to the group, {a.marker} three")
    # bob's phone has sessions with alice's phone (it answered hers) and with his laptop
    # (it opened that one); it opens one with alice's laptop to share its sender key.
    bp.start_sessions(alice_id)
    bp.make_sender_key(gid, [(alice_id, "phone"), (alice_id, "laptop"), (bob_id, "laptop")])
    for d in (ap, al, bl):
        d.read_mailbox()
    bp.post(gid, f"and back, {a.marker} four")
    for d in devices.values():
        d.received = []
        d.read_group(gid)
    assert bl.received == [f"to the group, {a.marker} three", f"and back, {a.marker} four"]
    assert al.received == bl.received
    assert ap.received == [f"and back, {a.marker} four"]
    assert bp.received == [f"to the group, {a.marker} three"]
    print("group messages: every member device decrypted the others' sender-key messages")
    print("all decrypted")


if __name__ == "__main__":
    sys.exit(main())
