-- PostgreSQL's 0009 drops the foreign keys of private_pairs and members to the head,
-- whose checks were a query of their own for every row written there. SQLite keeps them:
-- its check is a lookup inside the writer, and creating conversations measured the same
-- with the keys as without. This file keeps the two folders' numbers in step.
SELECT 1;
