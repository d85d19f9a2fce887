-- Social graph, groups and channels, and the per-user state stream.
-- Integers are 64-bit everywhere (the PostgreSQL twin uses BIGINT).

-- Roles (0 member, 1 admin, 2 owner), mutes, and how a membership ended
-- (0 member, 1 left, 2 kicked, 3 dissolved). The row holds the latest interval; earlier
-- closed intervals of the same user are in member_intervals.
ALTER TABLE members ADD COLUMN role INTEGER NOT NULL DEFAULT 0;
ALTER TABLE members ADD COLUMN muted_until INTEGER NOT NULL DEFAULT 0;
ALTER TABLE members ADD COLUMN state INTEGER NOT NULL DEFAULT 0;

-- Closed membership intervals before the latest one: seq in (joined_after_seq, left_at_seq].
CREATE TABLE member_intervals (
    conversation_id  INTEGER NOT NULL,
    user_id          TEXT NOT NULL,
    joined_after_seq INTEGER NOT NULL,
    left_at_seq      INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, user_id, joined_after_seq)
) WITHOUT ROWID;

-- Messages the server emitted (group tips, the friendship tip): never recallable.
ALTER TABLE messages ADD COLUMN system INTEGER NOT NULL DEFAULT 0;

-- Groups (conversation type 2) and channels (type 3). state: 0 active, 1 dissolved.
CREATE TABLE group_info (
    conversation_id INTEGER PRIMARY KEY REFERENCES conversations (conversation_id),
    owner_id        TEXT NOT NULL,
    name            TEXT NOT NULL,
    notice          TEXT NOT NULL DEFAULT '',
    avatar          TEXT NOT NULL DEFAULT '',
    join_policy     TEXT NOT NULL,
    mute_all        INTEGER NOT NULL DEFAULT 0,
    state           INTEGER NOT NULL DEFAULT 0,
    member_count    INTEGER NOT NULL DEFAULT 0,
    version         INTEGER NOT NULL DEFAULT 1,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);

-- One join request per (group, user): the latest. state: 0 pending, 1 approved, 2 rejected.
CREATE TABLE group_join_requests (
    conversation_id INTEGER NOT NULL,
    user_id         TEXT NOT NULL,
    request_id      TEXT NOT NULL,
    message         TEXT NOT NULL DEFAULT '',
    state           INTEGER NOT NULL,
    decided_by      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, user_id)
);

-- One friend request per direction: the latest.
-- state: 0 pending, 1 accepted, 2 rejected, 3 cancelled.
CREATE TABLE friend_requests (
    from_user  TEXT NOT NULL,
    to_user    TEXT NOT NULL,
    request_id TEXT NOT NULL UNIQUE,
    message    TEXT NOT NULL DEFAULT '',
    state      INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (from_user, to_user)
);
CREATE INDEX friend_requests_to ON friend_requests (to_user, state);

-- Friendships, one row per side (soft: active 0 once removed).
CREATE TABLE friendships (
    user_id    TEXT NOT NULL,
    friend_id  TEXT NOT NULL,
    active     INTEGER NOT NULL,
    since      INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (user_id, friend_id)
);

-- Blocks (soft: active 0 once unblocked).
CREATE TABLE blocks (
    blocker    TEXT NOT NULL,
    blocked    TEXT NOT NULL,
    active     INTEGER NOT NULL,
    since      INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (blocker, blocked)
);

-- The head row of each user's stream: seq is allocated under its lock. A reset moves the
-- epoch on and starts seq again.
CREATE TABLE user_streams (
    user_id  TEXT PRIMARY KEY,
    epoch    INTEGER NOT NULL,
    last_seq INTEGER NOT NULL
);

CREATE TABLE user_events (
    user_id      TEXT NOT NULL,
    epoch        INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    event        TEXT NOT NULL,
    -- the kind that checked data (friend-request), or NULL
    content_type INTEGER,
    data         TEXT NOT NULL,
    server_time  INTEGER NOT NULL,
    PRIMARY KEY (user_id, epoch, seq)
) WITHOUT ROWID;
