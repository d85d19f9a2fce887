//! Who may open a connection: at most `max_connections` at once, at most
//! `max_connections_per_address` from one client address (an IPv6 /64 counts as one). A
//! refused connection gets a `503 too_many_connections` answer and is closed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore};

use crate::api::error::envelope;
use crate::limits::{AddressKey, Guard};
use crate::protocol::{Code, Error};

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Total(usize),
    PerAddress(usize),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Total(n) => write!(f, "{n} open, server.max_connections"),
            Refusal::PerAddress(n) => write!(
                f,
                "{n} open from its address, server.max_connections_per_address"
            ),
        }
    }
}

impl Refusal {
    pub fn guard(self) -> Guard {
        match self {
            Refusal::Total(_) => Guard::TooManyConnections,
            Refusal::PerAddress(_) => Guard::TooManyFromAddress,
        }
    }
}

/// Refused connections answered at once; beyond, a refused connection is closed unanswered.
const ANSWERING: usize = 256;

pub struct Admission {
    max_total: usize,
    per_address: usize,
    total: AtomicUsize,
    by_address: Mutex<HashMap<AddressKey, usize>>,
    /// Signalled when the last connection ends (for shutdown).
    empty: Notify,
    answering: Arc<Semaphore>,
}

/// An admitted connection; dropping it (the last clone, for an upgraded WebSocket) frees
/// its place.
pub struct Admitted {
    admission: Arc<Admission>,
    key: AddressKey,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let a = &self.admission;
        if a.per_address > 0 {
            let mut by = a.by_address.lock().expect("admission lock");
            if let Some(n) = by.get_mut(&self.key) {
                *n -= 1;
                if *n == 0 {
                    by.remove(&self.key);
                }
            }
        }
        if a.total.fetch_sub(1, Ordering::AcqRel) == 1 {
            a.empty.notify_waiters();
        }
    }
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted").field("key", &self.key).finish()
    }
}

impl Admission {
    pub fn new(max_total: usize, per_address: usize) -> Arc<Admission> {
        Arc::new(Admission {
            max_total,
            per_address,
            total: AtomicUsize::new(0),
            by_address: Mutex::new(HashMap::new()),
            empty: Notify::new(),
            answering: Arc::new(Semaphore::new(ANSWERING)),
        })
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }

    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Admitted, Refusal> {
        let key = AddressKey::of(ip);
        if self
            .total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_total).then_some(n + 1)
            })
            .is_err()
        {
            return Err(Refusal::Total(self.max_total));
        }
        if self.per_address > 0 {
            let mut by = self.by_address.lock().expect("admission lock");
            let n = by.entry(key).or_insert(0);
            if *n >= self.per_address {
                drop(by);
                self.total.fetch_sub(1, Ordering::AcqRel);
                return Err(Refusal::PerAddress(self.per_address));
            }
            *n += 1;
        }
        Ok(Admitted {
            admission: self.clone(),
            key,
        })
    }

    /// Answers a refused connection `503 too_many_connections` (its `x-request-id` is `id`,
    /// which the refusal's debug line names) and closes it. The answer
    /// goes out first, then our end is shut down and the client's request read away for
    /// at most a second, so that closing does not reset the connection before the client
    /// read the answer. At most `ANSWERING` refusals are answered at a time.
    pub fn refuse(&self, mut stream: TcpStream, why: Refusal, id: String) {
        let Ok(permit) = self.answering.clone().try_acquire_owned() else {
            return;
        };
        let message = match why {
            Refusal::Total(n) => format!("the server has {n} connections open, its limit"),
            Refusal::PerAddress(n) => {
                format!("your address has {n} connections open, the limit per address")
            }
        };
        tokio::spawn(async move {
            let refusal = Error::new(Code::TooManyConnections, message);
            let body = envelope(&refusal).to_string();
            let answer = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
                 retry-after: 5\r\nconnection: close\r\nx-request-id: {id}\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                stream.write_all(answer.as_bytes()).await?;
                stream.shutdown().await?;
                let mut sink = [0u8; 4096];
                let mut read = 0usize;
                while read < 64 * 1024 {
                    match stream.read(&mut sink).await? {
                        0 => break,
                        n => read += n,
                    }
                }
                Ok::<_, std::io::Error>(())
            })
            .await;
            drop(permit);
        });
    }

    /// Waits until every connection ended, for at most `limit`.
    pub async fn drained(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, async {
            loop {
                let empty = self.empty.notified();
                if self.open() == 0 {
                    return;
                }
                empty.await;
            }
        })
        .await;
    }
}

/// Raises the process's open-file limit to its hard limit; the limit now.
pub fn raise_open_file_limit() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("cannot read or raise the open-file limit ({e}); assuming 1024");
            1024
        }
    }
}

/// The cap on open connections when the config leaves it to the server: the open-file
/// limit minus 1024 descriptors for the database, plugins and files, and at least 64.
pub fn default_max_connections(open_file_limit: u64) -> usize {
    (open_file_limit.saturating_sub(1024) as usize).max(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn caps_total_and_per_address_and_frees_on_drop() {
        let a = Admission::new(3, 2);
        let one: IpAddr = "10.0.0.1".parse().unwrap();
        let two: IpAddr = "10.0.0.2".parse().unwrap();
        let x = a.admit(one).unwrap();
        let _y = a.admit(one).unwrap();
        assert_eq!(a.admit(one).unwrap_err(), Refusal::PerAddress(2));
        let _z = a.admit(two).unwrap();
        assert_eq!(a.admit(two).unwrap_err(), Refusal::Total(3));
        drop(x);
        let _w = a.admit(one).unwrap();
        assert_eq!(a.open(), 3);
    }
}
