//! Presence: a user is online while any of their devices is, on any node. Who may see
//! whose: friends, and the other current members of a group the viewer is in (not
//! channels), unless they block the viewer. Friends' connections that
//! asked for it (`presence=true`) hear of changes as `presence` frames (live, the `latest`
//! class: a slow reader keeps only the newest per user); how often is the gateway's
//! throttle.

use serde::Serialize;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use crate::clock::now_ms;
use crate::messaging::{Core, LatestKey, PRESENCE, user_key};
use crate::plugins::Delivery as Class;
use crate::protocol::Error;
use crate::protocol::frames;

/// Most users one presence query names.
pub const MAX_PRESENCE_QUERY: usize = 200;

/// One user's presence as a viewer may see it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Presence {
    pub user_id: String,
    pub online: bool,
}

/// The coalescing key of a user's presence frames (no conversation has id 0).
fn presence_key(user_id: &str) -> LatestKey {
    (0, user_key(user_id), PRESENCE)
}

/// The `presence` frame saying `user_id` is `online` now (or not), with its coalescing
/// key (a slow reader keeps only the newest per user).
pub fn presence_frame(user_id: &str, online: bool) -> (Utf8Bytes, LatestKey) {
    (
        frames::presence(user_id, online, now_ms()),
        presence_key(user_id),
    )
}

impl Core {
    /// The presence of those of `users` that `viewer` may see, in the order asked; the
    /// others are left out, as unknown users are.
    pub async fn presence_of(
        &self,
        viewer: &str,
        users: &[String],
    ) -> Result<Vec<Presence>, Error> {
        if users.len() > MAX_PRESENCE_QUERY {
            return Err(Error::bad_request(format!(
                "ask for at most {MAX_PRESENCE_QUERY} users at once"
            )));
        }
        let mut asked: Vec<String> = Vec::with_capacity(users.len());
        for u in users {
            if u != viewer && !asked.contains(u) {
                asked.push(u.clone());
            }
        }
        let visible = self
            .store
            .presence_visible(viewer, &asked)
            .await
            .map_err(crate::store::unavailable)?;
        asked.retain(|u| visible.contains(u));
        let online = self.delivery.presence(&asked).await.ok_or_else(|| {
            Error::unavailable(
                "presence cannot be known now (Redis is unreachable, or was until moments ago \
                 and the nodes are writing their routes back); retry",
            )
        })?;
        Ok(asked
            .into_iter()
            .zip(online)
            .map(|(user_id, online)| Presence { user_id, online })
            .collect())
    }

    /// Tells `user_id`'s friends (but those it blocks) that it is `online` now (or not).
    pub async fn tell_friends(&self, user_id: &str, online: bool) {
        if let Some(to) = self.presence_audience(user_id).await
            && !to.is_empty()
        {
            let (frame, key) = presence_frame(user_id, online);
            self.delivery.push(&to, &frame, Class::Latest, Some(key), 0);
        }
    }

    /// Who hears of `user_id`'s presence: its friends, but those it blocks. `None` if the
    /// friends did not load (logged).
    pub async fn presence_audience(&self, user_id: &str) -> Option<Vec<String>> {
        match self.store.presence_audience(user_id).await {
            Ok(to) => Some(to),
            Err(e) => {
                tracing::warn!(user = %user_id, "presence not told, the friends did not load: {e}");
                None
            }
        }
    }

    /// Whether `user_id` has a device online anywhere (`None`: cannot be known now).
    pub async fn is_online(&self, user_id: &str) -> Option<bool> {
        let one = [user_id.to_string()];
        self.delivery.presence(&one).await.map(|v| v[0])
    }
}
