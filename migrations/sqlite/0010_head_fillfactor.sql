-- PostgreSQL's 0010 keeps half of each new page of conversations and read_positions free,
-- so their updates stay on the row's page (HOT). SQLite rewrites a row in place in its
-- b-tree and has no such setting. This file keeps the two folders' numbers in step.
SELECT 1;
