-- A group's receipts read every current member's read position. With only the primary key
-- (user_id, conversation_id), PostgreSQL finds a group's rows by scanning the whole table
-- or by probing the key once per member: for 10,000 members, 19.5-21.5 ms with 110,000
-- read positions in the table and 26-29 ms with 1,010,000. With this index the group's
-- positions are one range: 8.3-9.0 ms at either size. Its columns never change, so the
-- updates every batch makes to read positions stay HOT (0010). On a large database, build
-- it beforehand with CREATE INDEX CONCURRENTLY under the same name and columns: this
-- statement then finds it and does nothing (docs/deploy.md).
CREATE INDEX IF NOT EXISTS read_positions_by_conversation
    ON read_positions (conversation_id, user_id);
