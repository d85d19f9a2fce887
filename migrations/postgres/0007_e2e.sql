-- End-to-end encryption support: a directory of each device's public keys for X3DH, and
-- per-device mailboxes (to-device messages). The server holds public keys and
-- ciphertext only.

-- A device's long-term and medium-term public keys (base64 of their 32 raw bytes; the
-- signatures 64): the X25519 identity key, the Ed25519 key that signs, the signature of
-- the identity key and of each prekey under it. A rotated signed prekey stays as the
-- previous one until previous_prekey_until. low_told: a keys.low event was appended since
-- the last upload of one-time prekeys. max_claimed_id: the highest one-time prekey id handed
-- out (claims take the lowest first), so an upload never offers one of those again.
CREATE TABLE device_keys (
    user_id                   TEXT NOT NULL,
    device_id                 TEXT NOT NULL,
    identity_key              TEXT NOT NULL,
    signing_key               TEXT NOT NULL,
    identity_signature        TEXT NOT NULL,
    signed_prekey_id          BIGINT NOT NULL,
    signed_prekey             TEXT NOT NULL,
    signed_prekey_signature   TEXT NOT NULL,
    previous_prekey_id        BIGINT,
    previous_prekey           TEXT,
    previous_prekey_signature TEXT,
    previous_prekey_until     BIGINT,
    last_resort_id            BIGINT NOT NULL,
    last_resort_key           TEXT NOT NULL,
    last_resort_signature     TEXT NOT NULL,
    low_told                  BIGINT NOT NULL DEFAULT 0,
    max_claimed_id            BIGINT NOT NULL DEFAULT -1,
    updated_at                BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id)
);

-- One-time prekeys (X25519 public keys): each handed out once, deleted as it is.
CREATE TABLE one_time_prekeys (
    user_id    TEXT NOT NULL,
    device_id  TEXT NOT NULL,
    key_id     BIGINT NOT NULL,
    public_key TEXT NOT NULL,
    PRIMARY KEY (user_id, device_id, key_id)
);

-- A device's mailbox: its own gapless seq (the head row orders its entries), entries
-- deleted when the device acknowledges them or when they expire.
CREATE TABLE mailbox_heads (
    user_id   TEXT NOT NULL,
    device_id TEXT NOT NULL,
    last_seq  BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, device_id)
);

CREATE TABLE mailbox_entries (
    user_id          TEXT NOT NULL,
    device_id        TEXT NOT NULL,
    seq              BIGINT NOT NULL,
    sender_id        TEXT NOT NULL,
    sender_device_id TEXT NOT NULL,
    content_type     BIGINT NOT NULL,
    payload          TEXT NOT NULL,
    server_time      BIGINT NOT NULL,
    expires_at       BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, seq)
);
CREATE INDEX mailbox_entries_by_expiry ON mailbox_entries (expires_at);

-- A send to devices, by its clientMsgId: a resend gets the original answer and stores
-- nothing, even after the entries were acknowledged.
CREATE TABLE mailbox_sends (
    sender_id     TEXT NOT NULL,
    client_msg_id TEXT NOT NULL,
    answer        TEXT NOT NULL,
    expires_at    BIGINT NOT NULL,
    PRIMARY KEY (sender_id, client_msg_id)
);
CREATE INDEX mailbox_sends_by_expiry ON mailbox_sends (expires_at);
