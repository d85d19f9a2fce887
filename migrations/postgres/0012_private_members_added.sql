-- A private conversation's two member rows are inserted only by the statement that creates
-- its head (store::batch::pairs), in the transaction that creates it: no one can have read
-- the head's version before that commits, so their insert no longer moves it. On a first
-- message that move was a second write of the new head row, a fifth of the statement that
-- creates the conversation (ARCHITECTURE.md, "A private conversation's creation does not
-- move its version"). Every other change of members still moves the version: a group's
-- new members, and any member row updated or deleted (a block, a deleted account). The
-- function the triggers share is replaced in place: no lock on their tables.
CREATE OR REPLACE FUNCTION courier_head_version() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE conversations SET version = version + 1
    WHERE conversation_id IN (SELECT DISTINCT conversation_id FROM changed)
    AND NOT (TG_TABLE_NAME = 'members' AND TG_OP = 'INSERT' AND conversation_type = 1);
    RETURN NULL;
END
$$;
