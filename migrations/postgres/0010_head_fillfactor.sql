-- Every batch rewrites the heads it writes to and the read positions it moves. An update
-- is HOT (no new index entry, its old version pruned in place) only when the row's page has
-- room for the new version; at the default fill of 100 a page has none, so a conversation's
-- first message (its head inserted, then updated twice in the same transaction) and
-- more than half of the later updates went to another page with a new entry in the
-- primary key. Half of each new page is kept free for updates.
ALTER TABLE conversations SET (fillfactor = 50);
ALTER TABLE read_positions SET (fillfactor = 50);
