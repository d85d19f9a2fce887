#!/usr/bin/env python3
"""Summarizes an Autobahn|Testsuite fuzzingclient report of a Courier server.

Usage: summarize.py REPORT_DIR [--real-only]

Reads REPORT_DIR/index.json and the per-case JSON files beside it. Prints the counts per
`behavior` and per `behaviorClose`, then every case whose behaviorClose is not
OK/INFORMATIONAL or whose behavior is FAILED/WRONG CODE/UNCLEAN, sorted into three classes
(with --real-only, only the real protocol failures are listed one by one):

  real        a WebSocket protocol failure of the server.
  echo        fails only because Courier is not an echo server (see below).
  size-limit  the server closed with 1009 on a message above its configured frame limit.

Exit code: 1 if any real protocol failure remains, 0 otherwise (2: no report).

How failures are classified
---------------------------
The fuzzingclient assumes an echo server. Courier instead sends a `hello` JSON text frame
first and answers every data message (text or binary, valid or not) with one JSON text
frame (`error` bad_frame: a fuzz payload is no JSON object). So the received events never
equal the expected ones, and where a case waits for its echo before starting the closing
handshake, the client gives up after its timer and closes with 1001 "Going Away".

`behavior` (the events the client received) is "echo" when any of:
  * the case has expected event lists, and one of them equals the received events once
    (a) every text message that is a Courier JSON frame (payload starting with
    '{"type":') is removed from the received events, and (b) every message event is
    removed from the expected list; and the number of Courier answers received (frames
    other than `hello`) is at most the number of expected echoes (so a server that
    answers extra or drops pings/pongs does not pass as "echo");
  * the case checks the echo itself (9.*, 10.*, 12.*, 13.*: no expected lists) and its
    result says only that the echoed message's type/length/content differs, or that no
    echo came in time.
  It is "real" when the case says an endpoint detecting invalid data was the wrong one
  (closedByWrongEndpointIsFatal: the server did not fail the connection on invalid
  UTF-8), or when the received events differ in any other way (pongs, order, extras).

`behaviorClose` (the closing handshake) is:
  * "real" for UNCLEAN (the spec requires a clean close and the server dropped TCP without
    completing the closing handshake), for FAILED BY CLIENT, for a handshake never
    completed, and for FAILED when the server was expected to fail the connection and did
    not, or when it dropped the connection without a close frame;
  * "echo" for WRONG CODE when the client itself started the close with 1001 Going Away
    (its timer: it was still waiting for an echo) and the server answered with 1000 or
    echoed 1001 (RFC 6455 5.5.1 lets an endpoint echo the code it received);
  * "size-limit" for FAILED ("failed by the wrong endpoint") when the server closed with
    1009, and for a clean WRONG CODE 1009 (the client expected 1000; its close may have
    crossed the server's): the server refused a message above 4 x
    gateway.max_frame_bytes, which RFC 6455 allows (7.4.1);
  * "real" otherwise (e.g. WRONG CODE 1002 where 1007 is required).
A case is real if either part is real; else size-limit if either part is; else echo.
"""

import json
import os
import re
import sys
from collections import Counter

BAD_BEHAVIOR = {"FAILED", "WRONG CODE", "UNCLEAN"}
GOOD_CLOSE = {"OK", "INFORMATIONAL"}

# Results of the cases that compare the echo themselves (9.*, 10.*, 12.*, 13.*) that mean
# only "what came back is not my message".
ECHO_RESULTS = [
    re.compile(p)
    for p in (
        r"^Expected (text|binary) message with payload of length \d+, but got \d+\.$",
        r"^Expected (text|binary) message with payload, but got (text|binary)\.$",
        r"^Echo'ed message (type|length|contents|type or length) differs? ",
        r"^Did not receive message within \d+ seconds\.$",
        r"^Received (text|binary) message of length \d+\.$",
    )
]

COURIER_FRAME = '{"type":'
HELLO_FRAME = '{"type":"hello"'


def case_key(case_id):
    return [int(p) for p in case_id.split(".")]


def first_line(text):
    text = text or ""
    return re.split(r"<br\s*/?>|\n", text, maxsplit=1)[0].strip()


def is_courier_frame(ev):
    return (
        len(ev) >= 3
        and ev[0] == "message"
        and not ev[2]
        and isinstance(ev[1], str)
        and ev[1].startswith(COURIER_FRAME)
    )


def classify_behavior(c):
    """'ok', 'echo' or 'real' for the case's `behavior`."""
    if c.get("behavior") not in BAD_BEHAVIOR:
        return "ok"
    exp_close = c.get("expectedClose") or {}
    if exp_close.get("closedByWrongEndpointIsFatal") and exp_close.get("closedByMe") != c.get(
        "closedByMe"
    ):
        return "real"
    expected = c.get("expected") or {}
    received = [list(ev) for ev in c.get("received") or []]
    if expected:
        stripped_rx = [ev for ev in received if not is_courier_frame(ev)]
        answers = sum(
            1 for ev in received if is_courier_frame(ev) and not ev[1].startswith(HELLO_FRAME)
        )
        for events in expected.values():
            events = [list(ev) for ev in events]
            echoes = sum(1 for ev in events if ev[0] == "message")
            stripped_exp = [ev for ev in events if ev[0] != "message"]
            if stripped_exp == stripped_rx and answers <= echoes:
                return "echo"
        return "real"
    result = c.get("result") or ""
    if any(p.search(result) for p in ECHO_RESULTS):
        return "echo"
    return "real"


def classify_close(c):
    """'ok', 'echo', 'size-limit' or 'real' for the case's `behaviorClose`."""
    bc = c.get("behaviorClose")
    if bc in GOOD_CLOSE:
        return "ok"
    remote = c.get("remoteCloseCode")
    if bc == "WRONG CODE":
        gave_up = c.get("closedByMe") and c.get("localCloseCode") == 1001
        if gave_up and remote in (1000, 1001) and c.get("wasClean"):
            return "echo"
        # Courier sends 1009 only to refuse a message over its limit (the client's own
        # close may have crossed it).
        if remote == 1009 and c.get("wasClean"):
            return "size-limit"
        return "real"
    if bc == "FAILED" and remote == 1009 and not c.get("closedByMe"):
        return "size-limit"
    return "real"


def load(report_dir):
    with open(os.path.join(report_dir, "index.json")) as f:
        index = json.load(f)
    for agent, cases in index.items():
        for case_id, entry in cases.items():
            detail = {}
            path = os.path.join(report_dir, entry.get("reportfile") or "")
            if entry.get("reportfile") and os.path.exists(path):
                with open(path) as f:
                    detail = json.load(f)
            merged = dict(detail)
            merged.update({k: v for k, v in entry.items() if k not in merged})
            merged["id"] = case_id
            yield agent, merged


def counts(counter):
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items(), key=lambda kv: -kv[1]))


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    real_only = "--real-only" in argv
    if len(args) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    report_dir = args[0]
    if not os.path.exists(os.path.join(report_dir, "index.json")):
        print(f"no index.json in {report_dir}", file=sys.stderr)
        return 2

    by_agent = {}
    for agent, c in load(report_dir):
        by_agent.setdefault(agent, []).append(c)

    total_real = 0
    for agent, cases in sorted(by_agent.items()):
        cases.sort(key=lambda c: case_key(c["id"]))
        print(f"== Autobahn fuzzingclient: agent {agent}, {len(cases)} cases ({report_dir})")
        print("behavior:      " + counts(Counter(c.get("behavior") for c in cases)))
        print("behaviorClose: " + counts(Counter(c.get("behaviorClose") for c in cases)))
        classes = {"real": [], "size-limit": [], "echo": []}
        for c in cases:
            b, cl = classify_behavior(c), classify_close(c)
            parts = {b, cl} - {"ok"}
            if not parts:
                continue
            cls = "real" if "real" in parts else "size-limit" if "size-limit" in parts else "echo"
            c["_why"] = f"behavior {c.get('behavior')} ({b}), close {c.get('behaviorClose')} ({cl})"
            classes[cls].append(c)
        print(
            f"flagged: {sum(len(v) for v in classes.values())} — real protocol failures "
            f"{len(classes['real'])}, size-limit {len(classes['size-limit'])}, "
            f"echo-content only {len(classes['echo'])}"
        )
        for cls, title in (
            ("real", "REAL PROTOCOL FAILURES"),
            ("size-limit", "size-limit (1009 on a message above the frame limit)"),
            ("echo", "echo-content only (not an echo server)"),
        ):
            items = classes[cls]
            if not items:
                continue
            print(f"\n-- {title}: {len(items)}")
            if real_only and cls != "real":
                print("   " + " ".join(c["id"] for c in items))
                continue
            for c in items:
                print(f"{c['id']:>8}  {first_line(c.get('description'))}")
                print(f"          {c['_why']}; remote close code {c.get('remoteCloseCode')}")
                print(f"          result: {c.get('result')}")
                print(f"          resultClose: {c.get('resultClose')}")
                if cls == "real" and c.get("wasNotCleanReason"):
                    print(f"          wasNotCleanReason: {c.get('wasNotCleanReason')}")
        total_real += len(classes["real"])
        print()
    print(f"real protocol failures: {total_real}")
    return 1 if total_real else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
