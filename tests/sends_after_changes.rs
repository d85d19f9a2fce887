//! A change of who is in a conversation, or of a group's settings, holds for the very next
//! send. A committer decides the sends to a conversation it wrote to before from what it
//! remembers of it, and writes them only if the conversation's head has not moved since
//! (every change of members or settings moves it): so each step below sends once before a
//! change, so that the conversation is remembered, and the send right after the change
//! must meet the change. The real binary on loopback, on SQLite and on PostgreSQL.

#[macro_use]
mod common;

use common::groups::{create, id_of, say, say_fails};
use common::server::{Backend, Server, User, call, ok, setup};
use serde_json::{Value, json};

on_both!(
    each_group_change_holds_for_the_next_send,
    a_block_holds_for_the_next_send
);

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// What the next send must get: stored, or refused with this status and code.
enum Next {
    Stored,
    Refused(u16, &'static str),
}

/// One step: who changes (method, path, body), then who sends and what that send gets.
type Step<'a> = (&'a str, &'a str, String, Option<Value>, &'a str, Next);

async fn each_group_change_holds_for_the_next_send(b: Backend) {
    let (_db, s) = setup(&b, "sends-after-changes", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    let carol = s.user("carol").await;
    let cid = id_of(
        &create(
            &s,
            &alice,
            json!({"name": "Changes", "members": ["bob", "carol"]}),
        )
        .await,
    );
    let g = |rest: &str| format!("/v1/groups/{cid}{rest}");
    let hour = now_ms() + 3_600_000;
    let by_id = |id: &str| -> &User {
        match id {
            "alice" => &alice,
            "bob" => &bob,
            _ => &carol,
        }
    };
    // (who changes, method, path, body; who sends next, what that send gets)
    let steps: Vec<Step> = vec![
        (
            "alice",
            "POST",
            g("/mute"),
            Some(json!({"userId": "bob", "until": hour})),
            "bob",
            Next::Refused(403, "muted"),
        ),
        (
            "alice",
            "POST",
            g("/mute"),
            Some(json!({"userId": "bob", "until": 0})),
            "bob",
            Next::Stored,
        ),
        (
            "alice",
            "PATCH",
            g(""),
            Some(json!({"muteAll": true})),
            "carol",
            Next::Refused(403, "muted"),
        ),
        (
            "alice",
            "PUT",
            g("/admins/carol"),
            None,
            "carol",
            Next::Stored,
        ),
        (
            "alice",
            "PATCH",
            g(""),
            Some(json!({"muteAll": false})),
            "bob",
            Next::Stored,
        ),
        (
            "alice",
            "POST",
            g("/kick"),
            Some(json!({"userIds": ["carol"]})),
            "carol",
            Next::Refused(403, "not_a_member"),
        ),
        (
            "alice",
            "POST",
            g("/members"),
            Some(json!({"userIds": ["carol"]})),
            "carol",
            Next::Stored,
        ),
        (
            "bob",
            "POST",
            g("/quit"),
            None,
            "bob",
            Next::Refused(403, "not_a_member"),
        ),
        (
            "alice",
            "POST",
            g("/dissolve"),
            None,
            "alice",
            Next::Refused(409, "group_dissolved"),
        ),
    ];
    for (i, (who, method, path, body, sender, next)) in steps.into_iter().enumerate() {
        // Remembered: everyone who may still send does, before the change.
        for u in [&alice, &bob, &carol] {
            let (st, _) = call(
                &s,
                u,
                "POST",
                "/v1/messages",
                Some(json!({"clientMsgId": format!("before-{i}-{}", u.id),
                    "conversationId": cid, "conversationType": 2, "contentType": 1,
                    "payload": {"text": "before the change"}})),
            )
            .await;
            assert!(st == 200 || st == 403, "step {i}: {} answered {st}", u.id);
        }
        ok(&s, by_id(who), method, &path, body).await;
        match next {
            Next::Stored => {
                say(&s, by_id(sender), cid, 2, &format!("after step {i}")).await;
            }
            Next::Refused(status, code) => {
                say_fails(&s, by_id(sender), cid, 2, status, code).await;
            }
        }
    }
}

/// `from` sends a text to `to` by peer id: the status and answer.
async fn to_peer(s: &Server, from: &User, to: &str, n: usize) -> (u16, Value) {
    let body = json!({"clientMsgId": format!("m-{}-{n}", from.id), "conversationType": 1,
        "peerId": to, "contentType": 1, "payload": {"text": "hello"}});
    call(s, from, "POST", "/v1/messages", Some(body)).await
}

async fn a_block_holds_for_the_next_send(b: Backend) {
    let (_db, s) = setup(&b, "block-after-sends", "").await;
    let alice = s.user("alice").await;
    let bob = s.user("bob").await;
    // (alice blocks bob, or unblocks him, before this round; bob's send gets)
    let rounds = [
        (None, 200),
        (None, 200),
        (Some("PUT"), 403),
        (None, 403),
        (Some("DELETE"), 200),
        (None, 200),
    ];
    for (n, (change, bob_gets)) in rounds.into_iter().enumerate() {
        if let Some(method) = change {
            ok(&s, &alice, method, "/v1/blocks/bob", None).await;
        }
        let (st, got) = to_peer(&s, &alice, "bob", n).await;
        assert_eq!(st, 200, "alice's send {n}: {got}");
        let (st, got) = to_peer(&s, &bob, "alice", n).await;
        assert_eq!(st, bob_gets, "bob's send {n}: {got}");
        if st == 403 {
            assert_eq!(got["error"]["code"], "blocked", "{got}");
        }
    }
}
