//! Users and the server's own secrets.

use sqlx::Row as _;

use super::{Store, now_ms};

impl Store {
    /// Creates a user with a password hash; `false` if the id is taken.
    pub async fn create_user(&self, user_id: &str, password_hash: &str) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "INSERT INTO users (user_id, password_hash, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (user_id) DO NOTHING",
        )
        .bind(user_id)
        .bind(password_hash)
        .bind(now_ms())
        .execute(self.write())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// `None`: no such user; `Some(None)`: a user known only from tokens (no password).
    pub async fn password_hash(&self, user_id: &str) -> sqlx::Result<Option<Option<String>>> {
        let row = sqlx::query("SELECT password_hash FROM users WHERE user_id = $1")
            .bind(user_id)
            .fetch_optional(self.read())
            .await?;
        row.map(|r| r.try_get::<Option<String>, _>(0)).transpose()
    }

    /// Records a user first seen in a token, so others can message them.
    pub async fn ensure_user(&self, user_id: &str) -> sqlx::Result<()> {
        let known = sqlx::query("SELECT 1 FROM users WHERE user_id = $1")
            .bind(user_id)
            .fetch_optional(self.read())
            .await?
            .is_some();
        if !known {
            sqlx::query(
                "INSERT INTO users (user_id, password_hash, created_at) VALUES ($1, NULL, $2) \
                 ON CONFLICT (user_id) DO NOTHING",
            )
            .bind(user_id)
            .bind(now_ms())
            .execute(self.write())
            .await?;
        }
        Ok(())
    }

    /// The secret stored under `name`, storing `fresh` first if there is none. Two servers
    /// starting at once on one database agree on the first one written.
    pub async fn secret_or_insert(&self, name: &str, fresh: &str) -> sqlx::Result<String> {
        sqlx::query(
            "INSERT INTO server_secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(fresh)
        .execute(self.write())
        .await?;
        sqlx::query("SELECT value FROM server_secrets WHERE name = $1")
            .bind(name)
            .fetch_one(self.write())
            .await?
            .try_get(0)
    }
}
