"""`example-poll` (content type 1001): a question with 2-10 options, written in Python.

Built with componentize-py against Courier's WIT contract (wit/v1); see build.sh.
"""

import json

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.kind import (
    Context,
    Delivery,
    Example,
    KindManifest,
    Rejection,
    Sender,
)

MAX_QUESTION = 300
MAX_OPTION = 100


def reject(code: str, message: str) -> Err:
    return Err(Rejection(code=code, message=message))


def normalize(payload: str) -> dict:
    try:
        poll = json.loads(payload)
    except (ValueError, RecursionError) as e:
        raise reject("malformed_json", f"payload is not valid JSON: {e}")
    if not isinstance(poll, dict):
        raise reject("invalid_field", "payload must be a JSON object")
    unknown = set(poll) - {"question", "options", "multiple"}
    if unknown:
        raise reject("invalid_field", f"unknown field {sorted(unknown)[0]}")
    question = poll.get("question")
    if not isinstance(question, str) or not question.strip():
        raise reject("empty", "question must be a non-empty string")
    question = question.strip()
    if len(question) > MAX_QUESTION:
        raise reject("too_long", f"question is at most {MAX_QUESTION} characters")
    options = poll.get("options")
    if not isinstance(options, list) or not 2 <= len(options) <= 10:
        raise reject("bad_options", "options must list 2 to 10 choices")
    clean = []
    for o in options:
        if not isinstance(o, str) or not o.strip() or len(o.strip()) > MAX_OPTION:
            raise reject("bad_options", f"each option is 1 to {MAX_OPTION} characters")
        if o.strip() in clean:
            raise reject("bad_options", "options must be distinct")
        clean.append(o.strip())
    multiple = poll.get("multiple", False)
    if not isinstance(multiple, bool):
        raise reject("invalid_field", "multiple must be true or false")
    return {"question": question, "options": clean, "multiple": multiple}


def to_text(poll: dict) -> str:
    """The normalized JSON text. A lone surrogate escape (`"\\ud800"`) parses into a str
    that is not valid Unicode and could not be handed back to the host: rejected here."""
    text = json.dumps(poll, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise reject("invalid_field", "text must be valid Unicode (a lone surrogate was found)")
    return text


class Kind(exports.Kind):
    def manifest(self) -> KindManifest:
        return KindManifest(
            name="example-poll",
            version="1.0.0",
            content_type=1001,
            delivery=Delivery.PERSISTENT,
            counts_unread=True,
            conversation_types=bytes([2, 3]),
            sender=Sender.USER,
            max_payload_bytes=4096,
            description="A poll: a question with 2 to 10 distinct options (example plugin in Python)",
        )

    def validate(self, ctx: Context, payload: str) -> str:
        return to_text(normalize(payload))

    def preview(self, payload: str) -> str:
        try:
            poll = normalize(payload)
            to_text(poll)
            return "[poll] " + poll["question"]
        except Err:
            return ""

    def examples(self) -> list[Example]:
        return [
            Example(name="basic", conversation_type=2, payload='{"question":"Lunch?","options":["pizza","sushi"]}', accepted=True),
            Example(name="multiple", conversation_type=3, payload='{"question":" Which days? ","options":["Mon","Tue","Wed"],"multiple":true}', accepted=True),
            Example(name="one-option", conversation_type=2, payload='{"question":"Lunch?","options":["pizza"]}', accepted=False),
            Example(name="duplicate", conversation_type=2, payload='{"question":"Lunch?","options":["a","a"]}', accepted=False),
            Example(name="not-object", conversation_type=2, payload='[1,2]', accepted=False),
            Example(name="empty-question", conversation_type=2, payload='{"question":"","options":["a","b"]}', accepted=False),
        ]
