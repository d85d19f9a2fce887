-- Every batch rewrites the heads it writes to and the read positions it moves. An update
-- is HOT (no new index entry, its old version pruned in place) only when the row's page has
-- room for the new version; at the default fill of 100 a page has none until older
-- versions are pruned, so many updates went to another page with a new entry in the
-- primary key (ARCHITECTURE.md has the counts). Half of each new page is kept free for
-- updates.
ALTER TABLE conversations SET (fillfactor = 50);
ALTER TABLE read_positions SET (fillfactor = 50);
