-- Whether a member of a private conversation blocks the other member, kept with the
-- membership row by every block and unblock, so a send reads it with the row it reads
-- anyway instead of looking blocks up.
ALTER TABLE members ADD COLUMN blocks_peer INTEGER NOT NULL DEFAULT 0;
