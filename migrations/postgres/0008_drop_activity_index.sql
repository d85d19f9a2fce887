-- conversations_by_activity (last_time, conversation_id) served no query: the overview
-- orders a member's conversations by an expression over the member's own row. Every
-- message moved its entry (a page of the log per conversation per commit on SQLite; on
-- PostgreSQL, no head update could be HOT while it indexed last_time).
DROP INDEX IF EXISTS conversations_by_activity;
