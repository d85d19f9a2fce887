//! Who may use a token: its signature and times (`auth::Tokens`), then the account's own
//! state — deleted, every token before a cut-off revoked, single tokens logged out. Each
//! node keeps what it read of an account; the revocations it makes change that copy in
//! the same call (cluster mode has to carry them to the other nodes).

use std::collections::HashMap;

use super::{Cached, Core, Forget, Which};
use crate::auth::{TokenId, Verified};
use crate::clock::now_ms;
use crate::protocol::Close;
use crate::protocol::{Code, Error};
use crate::store::accounts::AccountRow;

/// What this node knows of an account.
#[derive(Debug, Clone, Default)]
pub(super) struct Account {
    valid_from: i64,
    deleted: bool,
    /// Revoked tokens and their expiry (Unix seconds).
    revoked: HashMap<TokenId, i64>,
}

impl Account {
    fn from_row(row: AccountRow) -> Account {
        let revoked = row
            .revoked
            .iter()
            .filter_map(|(id, exp)| {
                let bytes = hex::decode(id).ok()?;
                Some((TokenId::try_from(bytes.as_slice()).ok()?, *exp))
            })
            .collect();
        Account {
            valid_from: row.tokens_valid_from,
            deleted: row.deleted,
            revoked,
        }
    }

    fn admits(&self, v: &Verified) -> Result<(), Error> {
        match self.refuses(v.id, v.issued_at) {
            Some(Close::Deleted) => Err(deleted()),
            Some(_) => Err(revoked()),
            None => Ok(()),
        }
    }

    /// Why a token (its id and when it was issued) no longer works: the account deleted,
    /// or the token revoked.
    fn refuses(&self, id: TokenId, issued_at: Option<i64>) -> Option<Close> {
        if self.deleted {
            return Some(Close::Deleted);
        }
        if self.valid_from > 0 && issued_at.is_none_or(|iat| iat < self.valid_from) {
            return Some(Close::Revoked);
        }
        if self.revoked.contains_key(&id) {
            return Some(Close::Revoked);
        }
        None
    }
}

/// How many accounts, or devices, one statement of `Core::no_longer_admitted` reads.
const RECHECK_CHUNK: usize = 500;

/// A connection as the node holding it knows it: whose, which device, and its token.
#[derive(Debug, Clone)]
pub struct Held {
    pub user_id: String,
    pub device_id: String,
    pub token: TokenId,
    /// When the token was issued (Unix seconds), if it says.
    pub issued_at: Option<i64>,
}

fn revoked() -> Error {
    Error::new(
        Code::Unauthorized,
        "the token was revoked (logout or revoke-all); log in again",
    )
}

pub(crate) fn deleted() -> Error {
    Error::new(Code::AccountDeleted, "the account was deleted")
}

/// A request's authenticated caller.
#[derive(Debug, Clone)]
pub struct Session {
    pub user_id: String,
    pub token: TokenId,
    /// When the token was issued (Unix seconds), if it says.
    pub issued_at: Option<i64>,
    /// The token's expiry (Unix seconds).
    pub expires_at: i64,
}

impl Core {
    /// The user a bearer token speaks for, if the token is valid and not revoked and the
    /// account not deleted. A user first seen in a token becomes known to the server.
    pub async fn authenticate(&self, token: &str) -> Result<Session, Error> {
        let v = self
            .tokens
            .verify(token)
            .map_err(|e| Error::new(Code::Unauthorized, e.to_string()))?;
        let known = self
            .accounts
            .lock()
            .expect("accounts")
            .get(&v.user_id)
            .and_then(|a| a.fresh(self.settings.cache_max_age))
            .map(|a| a.admits(&v));
        match known {
            Some(verdict) => verdict?,
            None => {
                let row = self
                    .store
                    .account(&v.user_id)
                    .await
                    .map_err(crate::store::unavailable)?;
                let account = Account::from_row(row);
                let verdict = account.admits(&v);
                self.accounts
                    .lock()
                    .expect("accounts")
                    .insert(v.user_id.clone(), Cached::new(account));
                verdict?;
            }
        }
        Ok(Session {
            user_id: v.user_id,
            token: v.id,
            issued_at: v.issued_at,
            expires_at: v.expires_at,
        })
    }

    /// Which of `held` (this node's connections) may no longer stay, read again from the
    /// database, and why: the account deleted, the token revoked, the device removed. For
    /// a node that did not hear what the others said for a while (its bus came back): the
    /// closes they sent meanwhile were lost. The accounts and devices are read
    /// `RECHECK_CHUNK` at a time; an error ends the pass (the caller runs it again).
    pub async fn no_longer_admitted(&self, held: &[Held]) -> Result<Vec<(Held, Close)>, Error> {
        let unavailable = crate::store::unavailable;
        let mut users: Vec<&str> = held.iter().map(|h| h.user_id.as_str()).collect();
        users.sort_unstable();
        users.dedup();
        let mut accounts: HashMap<String, Account> = HashMap::new();
        for chunk in users.chunks(RECHECK_CHUNK) {
            let mut rows = self.store.accounts(chunk).await.map_err(unavailable)?;
            for user in chunk {
                let row = match rows.remove(*user) {
                    Some(row) => row,
                    // No row: what `account` makes of such a user.
                    None => self.store.account(user).await.map_err(unavailable)?,
                };
                accounts.insert(user.to_string(), Account::from_row(row));
            }
        }
        let mut out = Vec::new();
        let mut admitted = Vec::new();
        for h in held {
            match accounts[h.user_id.as_str()].refuses(h.token, h.issued_at) {
                Some(why) => out.push((h.clone(), why)),
                None => admitted.push(h),
            }
        }
        for chunk in admitted.chunks(RECHECK_CHUNK) {
            let devices: Vec<(&str, &str)> = chunk
                .iter()
                .map(|h| (h.user_id.as_str(), h.device_id.as_str()))
                .collect();
            let removed = self
                .store
                .devices_removed(&devices)
                .await
                .map_err(unavailable)?;
            out.extend(
                chunk
                    .iter()
                    .filter(|h| removed.contains(&(h.user_id.clone(), h.device_id.clone())))
                    .map(|h| ((*h).clone(), Close::DeviceRemoved)),
            );
        }
        Ok(out)
    }

    /// Why a connection that just registered may not stay, if it may not: what this node
    /// knows of the account (a deletion marks it first) and the account read again from
    /// the database (a revocation that committed after the upgrade's check, whose closes
    /// went out before this connection was there). The read is not cached: a revocation
    /// racing it may have written the cache since.
    pub async fn refused_now(
        &self,
        user_id: &str,
        token: TokenId,
        issued_at: Option<i64>,
    ) -> Option<Close> {
        let known = self
            .accounts
            .lock()
            .expect("accounts")
            .get(user_id)
            .and_then(|a| a.value.refuses(token, issued_at));
        if known.is_some() {
            return known;
        }
        // A read that fails leaves the connection as the upgrade admitted it.
        let row = self.store.account(user_id).await.ok()?;
        Account::from_row(row).refuses(token, issued_at)
    }

    /// The cut-off a new token of `user_id` must meet (`Tokens::issue_from`).
    pub fn tokens_valid_from(&self, user_id: &str) -> i64 {
        self.accounts
            .lock()
            .expect("accounts")
            .get(user_id)
            .map_or(0, |a| a.value.valid_from)
    }

    /// Logout: this token stops working, and the connections opened with it close (4003).
    pub async fn revoke_token(&self, s: &Session) -> Result<(), Error> {
        self.store
            .revoke_token(&s.user_id, &hex::encode(s.token), s.expires_at)
            .await
            .map_err(crate::store::unavailable)?;
        if let Some(a) = self.accounts.lock().expect("accounts").get_mut(&s.user_id) {
            let now = now_ms() / 1000;
            a.value.revoked.retain(|_, exp| *exp + 3600 >= now);
            a.value.revoked.insert(s.token, s.expires_at);
        }
        // Other nodes read the account again before they close its connections.
        self.delivery.announce(&Forget::Account(s.user_id.clone()));
        self.delivery
            .close(&s.user_id, Which::Token(s.token), Close::Revoked);
        Ok(())
    }

    /// Every token of `user_id` issued until now stops working, and its connections close
    /// (4003). Returns the cut-off: tokens must be issued from that second on (the next
    /// login's is).
    pub async fn revoke_all_tokens(&self, user_id: &str) -> Result<i64, Error> {
        // Tokens carry whole seconds: everything issued in this second goes too.
        let valid_from = self
            .store
            .revoke_tokens_before(user_id, now_ms() / 1000 + 1)
            .await
            .map_err(crate::store::unavailable)?;
        if let Some(a) = self.accounts.lock().expect("accounts").get_mut(user_id) {
            a.value.valid_from = valid_from;
        }
        self.delivery
            .announce(&Forget::Account(user_id.to_string()));
        self.delivery.close(user_id, Which::All, Close::Revoked);
        Ok(valid_from)
    }

    /// Forgets what every node read of the account (it is read again on its next use).
    pub(crate) fn unforget_account(&self, user_id: &str) {
        self.forget(Forget::Account(user_id.to_string()));
    }

    /// Marks the account deleted on this node (other nodes read it again) and closes its
    /// connections everywhere (4004).
    pub(crate) fn forget_account(&self, user_id: &str) {
        let deleted = Account {
            deleted: true,
            ..Account::default()
        };
        self.accounts
            .lock()
            .expect("accounts")
            .insert(user_id.to_string(), Cached::new(deleted));
        self.delivery
            .announce(&Forget::Account(user_id.to_string()));
        self.delivery.close(user_id, Which::All, Close::Deleted);
    }
}
