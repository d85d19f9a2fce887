-- As PostgreSQL's 0012: a private conversation's two member rows are inserted only with
-- its head, before anyone can have read its version, so their insert no longer moves it.
DROP TRIGGER members_added;
CREATE TRIGGER members_added AFTER INSERT ON members BEGIN
    UPDATE conversations SET version = version + 1
    WHERE conversation_id = NEW.conversation_id AND conversation_type <> 1;
END;
