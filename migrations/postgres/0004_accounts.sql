-- Revoking tokens and deleting accounts.
-- Integers are 64-bit everywhere (the PostgreSQL twin uses BIGINT).

-- Tokens issued (iat) before this Unix second are refused: "revoke all my tokens".
ALTER TABLE users ADD COLUMN tokens_valid_from BIGINT NOT NULL DEFAULT 0;
-- Set when the account was deleted; the row stays so the id is never taken again.
ALTER TABLE users ADD COLUMN deleted_at BIGINT;
-- The id the deleted account's rows carry instead of this one ("deleted:…").
ALTER TABLE users ADD COLUMN alias TEXT;

-- Single tokens revoked by logout, until they expire anyway.
CREATE TABLE revoked_tokens (
    -- the first 16 bytes of the token's SHA-256, in hex
    token_id   TEXT PRIMARY KEY,
    user_id    TEXT NOT NULL,
    -- the token's exp (Unix seconds): the row may go after it
    expires_at BIGINT NOT NULL
);
CREATE INDEX revoked_tokens_by_user ON revoked_tokens (user_id);

-- members.state 4: in a private conversation, the other member's account was deleted
-- (sends to it are refused).
