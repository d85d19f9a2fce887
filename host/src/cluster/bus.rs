//! The message bus between nodes: NATS (core publish/subscribe, no persistence) or Redis
//! pub/sub. Only the fast path: a message the bus loses is a push a device misses, and
//! the device's pull covers it (it sees the seq gap at its next push or reconnect).
//!
//! Subjects, under the deployment's prefix `p`: `p.node.{id}` for what one node must
//! hear (its devices' pushes, kicks), `p.all` for what every node must (closes, cache
//! invalidations, pushes when the routes cannot be read).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::sync::mpsc;

use super::health::{Health, Part};
use crate::config::{BusKind, ClusterConfig};

/// A message off the bus, and whether the bus reconnected just before it (what was said
/// while it was away is lost: caches must be dropped).
pub enum Incoming {
    Message(Vec<u8>),
    Reconnected,
}

#[derive(Clone)]
pub enum Bus {
    Nats(async_nats::Client),
    Redis(redis::aio::ConnectionManager),
}

/// How long a publish may wait for a bus that is away before it is given up.
const PUBLISH_WAIT: Duration = Duration::from_millis(500);

pub fn node_subject(prefix: &str, node: u16) -> String {
    format!("{prefix}.node.{node}")
}

pub fn all_subject(prefix: &str) -> String {
    format!("{prefix}.all")
}

impl Bus {
    /// Connects and subscribes to this node's subjects; what arrives goes to the returned
    /// queue. Reconnects by itself; `health` follows the connection.
    pub async fn connect(
        c: &ClusterConfig,
        health: Arc<Health>,
    ) -> anyhow::Result<(Bus, mpsc::Receiver<Incoming>)> {
        let subjects = [node_subject(&c.prefix, c.node_id), all_subject(&c.prefix)];
        let (tx, rx) = mpsc::channel(4096);
        match c.bus {
            BusKind::Nats => {
                let events = tx.clone();
                let h = health.clone();
                let client = async_nats::ConnectOptions::new()
                    .connection_timeout(Duration::from_secs(3))
                    .max_reconnects(None)
                    .retry_on_initial_connect()
                    .reconnect_delay_callback(|attempts| {
                        Duration::from_millis((100 * attempts as u64).min(2_000))
                    })
                    .event_callback(move |event| {
                        let (events, h) = (events.clone(), h.clone());
                        async move {
                            match event {
                                async_nats::Event::Disconnected => {
                                    h.fail(Part::Bus, "NATS disconnected");
                                }
                                async_nats::Event::Connected => {
                                    if h.recover(Part::Bus) {
                                        let _ = events.send(Incoming::Reconnected).await;
                                    }
                                }
                                other => tracing::debug!("NATS: {other}"),
                            }
                        }
                    })
                    .connect(c.bus_address())
                    .await?;
                // Wait (bounded) for the first connection, so a bus that is there at
                // start-up is used from the first message.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                while client.connection_state() != async_nats::connection::State::Connected
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if client.connection_state() != async_nats::connection::State::Connected {
                    health.fail(Part::Bus, "NATS unreachable");
                    tracing::warn!(url = %c.bus_address(), "NATS is not reachable; starting without it");
                }
                for subject in subjects {
                    let mut sub = client.subscribe(subject).await?;
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        while let Some(m) = sub.next().await {
                            if tx
                                .send(Incoming::Message(m.payload.to_vec()))
                                .await
                                .is_err()
                            {
                                break;
                            }
                        }
                    });
                }
                Ok((Bus::Nats(client), rx))
            }
            BusKind::Redis => {
                let client = redis::Client::open(c.bus_address())?;
                let publisher = super::connect_redis(&client).await?;
                tokio::spawn(redis_subscriber(client, subjects, tx, health));
                Ok((Bus::Redis(publisher), rx))
            }
        }
    }

    /// Publishes; an error (the bus is away) loses the message, which the pull covers.
    pub async fn publish(&self, subject: String, payload: Vec<u8>) -> Result<(), String> {
        match self {
            Bus::Nats(client) => {
                if client.connection_state() != async_nats::connection::State::Connected {
                    return Err("NATS disconnected".into());
                }
                match tokio::time::timeout(PUBLISH_WAIT, client.publish(subject, payload.into()))
                    .await
                {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("NATS publish timed out".into()),
                }
            }
            Bus::Redis(conn) => {
                let mut conn = conn.clone();
                let mut cmd = redis::cmd("PUBLISH");
                cmd.arg(subject).arg(payload);
                match tokio::time::timeout(PUBLISH_WAIT, cmd.query_async::<i64>(&mut conn)).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("Redis publish timed out".into()),
                }
            }
        }
    }
}

/// Redis pub/sub: one connection subscribed to this node's channels, opened again (and
/// said so) whenever it drops.
async fn redis_subscriber(
    client: redis::Client,
    subjects: [String; 2],
    tx: mpsc::Sender<Incoming>,
    health: Arc<Health>,
) {
    let mut delay = Duration::from_millis(100);
    let mut first = true;
    loop {
        let subscribed = async {
            let mut ps = client.get_async_pubsub().await?;
            for s in &subjects {
                ps.subscribe(s).await?;
            }
            Ok::<_, redis::RedisError>(ps)
        };
        match tokio::time::timeout(Duration::from_secs(3), subscribed).await {
            Ok(Ok(ps)) => {
                delay = Duration::from_millis(100);
                if health.recover(Part::Bus) || !first {
                    let _ = tx.send(Incoming::Reconnected).await;
                }
                first = false;
                let mut stream = ps.into_on_message();
                while let Some(m) = stream.next().await {
                    if tx
                        .send(Incoming::Message(m.get_payload_bytes().to_vec()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                health.fail(Part::Bus, "Redis pub/sub disconnected");
            }
            Ok(Err(e)) => {
                health.fail(Part::Bus, &format!("Redis pub/sub: {e}"));
            }
            Err(_) => {
                health.fail(Part::Bus, "Redis pub/sub: connect timed out");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}
