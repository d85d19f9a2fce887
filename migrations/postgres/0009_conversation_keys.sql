-- A private conversation's pair and members are written by the statement that creates its
-- head, and a group's members under the lock of a head that exists; no head is ever
-- deleted. The foreign keys to the head checked that again for every row written, each
-- through a query of its own: a third of the time of the statement that creates private
-- conversations, and a check per member of every batch of members added to a group.
-- SQLite keeps its keys (its 0009 says why).
ALTER TABLE private_pairs DROP CONSTRAINT private_pairs_conversation_id_fkey;
ALTER TABLE members DROP CONSTRAINT members_conversation_id_fkey;
