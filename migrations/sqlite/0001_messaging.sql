-- Messaging core: accounts, conversations with their head rows, messages, members,
-- read positions. Integers are 64-bit everywhere (the PostgreSQL twin uses BIGINT).

CREATE TABLE users (
    user_id       TEXT PRIMARY KEY,
    -- NULL for users known only from tokens signed by the deployer's backend
    password_hash TEXT,
    created_at    INTEGER NOT NULL
);

CREATE TABLE server_secrets (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- The head row of each conversation stream: seq is allocated under its lock.
CREATE TABLE conversations (
    conversation_id   INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_type INTEGER NOT NULL,
    last_seq          INTEGER NOT NULL DEFAULT 0,
    -- messages that count toward unread, in seq 1..=last_seq
    unread_acc        INTEGER NOT NULL DEFAULT 0,
    last_time         INTEGER NOT NULL,
    created_at        INTEGER NOT NULL
);
CREATE INDEX conversations_by_activity ON conversations (last_time, conversation_id);

-- One private conversation per pair of users (user_lo < user_hi).
CREATE TABLE private_pairs (
    user_lo         TEXT NOT NULL,
    user_hi         TEXT NOT NULL,
    conversation_id INTEGER NOT NULL UNIQUE REFERENCES conversations (conversation_id),
    PRIMARY KEY (user_lo, user_hi)
);

-- Membership with the seq interval it covers: the member sees seq in
-- (joined_after_seq, left_at_seq] (left_at_seq NULL: still a member).
CREATE TABLE members (
    conversation_id  INTEGER NOT NULL REFERENCES conversations (conversation_id),
    user_id          TEXT NOT NULL,
    joined_after_seq INTEGER NOT NULL DEFAULT 0,
    left_at_seq      INTEGER,
    joined_at        INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, user_id)
);
CREATE INDEX members_by_user ON members (user_id, conversation_id);

CREATE TABLE messages (
    conversation_id INTEGER NOT NULL,
    seq             INTEGER NOT NULL,
    msg_id          INTEGER NOT NULL,
    sender_id       TEXT NOT NULL,
    client_msg_id   TEXT NOT NULL,
    content_type    INTEGER NOT NULL,
    payload         TEXT NOT NULL,
    server_time     INTEGER NOT NULL,
    counts_unread   INTEGER NOT NULL,
    -- counting messages in seq 1..=seq of this conversation
    unread_acc      INTEGER NOT NULL,
    -- seq of the recall event that hid this message; 0: not recalled
    recalled_by     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (conversation_id, seq)
) WITHOUT ROWID;
CREATE UNIQUE INDEX messages_client_msg_id ON messages (sender_id, client_msg_id);
CREATE INDEX messages_recalled_counting ON messages (conversation_id, seq)
    WHERE recalled_by <> 0 AND counts_unread = 1;

CREATE TABLE read_positions (
    user_id         TEXT NOT NULL,
    conversation_id INTEGER NOT NULL,
    read_seq        INTEGER NOT NULL,
    -- unread_acc of the message at read_seq (0 at seq 0)
    read_acc        INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (user_id, conversation_id)
) WITHOUT ROWID;
