-- Devices as records of their own, delivery positions, and offline push.
-- Integers are 64-bit everywhere (the PostgreSQL twin uses BIGINT).

-- A user's device: registered the first time it connects (or explicitly), listed and
-- removable by its user. A removed device keeps its row (removed_at) so it cannot come
-- back with the same id unless its user registers it again.
CREATE TABLE devices (
    user_id       TEXT NOT NULL,
    device_id     TEXT NOT NULL,
    name          TEXT NOT NULL DEFAULT '',
    platform      TEXT NOT NULL DEFAULT '',
    first_seen    INTEGER NOT NULL,
    last_seen     INTEGER NOT NULL,
    removed_at    INTEGER,
    -- where an offline notice for this device goes (APNs, FCM, …), if anywhere
    push_provider TEXT,
    push_token    TEXT,
    PRIMARY KEY (user_id, device_id)
) WITHOUT ROWID;

-- How far a member's devices have received a conversation (the first device's `received`
-- moves it): monotonic, like read_seq.
ALTER TABLE read_positions ADD COLUMN delivered_seq INTEGER NOT NULL DEFAULT 0;

-- A member who muted a conversation's notifications gets no offline notice for it.
ALTER TABLE members ADD COLUMN push_muted INTEGER NOT NULL DEFAULT 0;
