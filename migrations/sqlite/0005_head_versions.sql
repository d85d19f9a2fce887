-- A conversation's head row carries a version that moves with every change of what a
-- send's rules read: its membership rows (who is in it, roles, mutes, blocks, a deleted
-- member) and a group's settings. A committer that remembers a conversation from an
-- earlier batch writes its next messages with one statement that compares the head's
-- last seq and version with what it remembers (and fails, writing nothing, when either
-- moved). Triggers keep it, so no writer of those rows can forget to.
ALTER TABLE conversations ADD COLUMN version INTEGER NOT NULL DEFAULT 0;

CREATE TRIGGER members_added AFTER INSERT ON members BEGIN
    UPDATE conversations SET version = version + 1
    WHERE conversation_id = NEW.conversation_id;
END;
CREATE TRIGGER members_changed AFTER UPDATE ON members BEGIN
    UPDATE conversations SET version = version + 1
    WHERE conversation_id IN (OLD.conversation_id, NEW.conversation_id);
END;
CREATE TRIGGER members_removed AFTER DELETE ON members BEGIN
    UPDATE conversations SET version = version + 1
    WHERE conversation_id = OLD.conversation_id;
END;
CREATE TRIGGER group_info_added AFTER INSERT ON group_info BEGIN
    UPDATE conversations SET version = version + 1
    WHERE conversation_id = NEW.conversation_id;
END;
CREATE TRIGGER group_info_changed AFTER UPDATE ON group_info BEGIN
    UPDATE conversations SET version = version + 1
    WHERE conversation_id IN (OLD.conversation_id, NEW.conversation_id);
END;
