//! Device routes in Redis, laid out as DESIGN.md §8 has them, under the deployment's
//! prefix `p`:
//!
//! - `p:dev:{user}`: the set of the user's device ids that have (or recently had) a route;
//! - `p:route:{user}:{device}`: `{nodeId}:{sessionId}:{at}` of the device's connection,
//!   with an expiry (`route_ttl_secs`, 90 s) that the holding node refreshes. `at` (Unix
//!   milliseconds) orders the device's connections: the newer holds the route. It is the
//!   connection's time (by the time the nodes keep, Redis's: `cluster::keep_time`), raised
//!   past the route it replaced, so a registration made through Redis is newer than what
//!   it replaced whatever the nodes' clocks say; connections made while Redis was away are
//!   ordered by Redis's time as their nodes last read it;
//! - `p:node:{nodeId}`: the live node's lease on its number (`lease_secs`);
//! - `p:nodedev:{nodeId}`: the `{user}:{device}` routes a node wrote, so that when it dies
//!   another node can take its routes out at once rather than after their expiry;
//! - `p:nodes`: the node numbers that have run;
//! - `p:told:{user}`: what the user's friends were last told of its presence (`1`, `0`);
//! - `p:toldat`: the users whose friends were told of their presence in the last
//!   `TOLD_KEPT_MS`, scored by when (Redis's clock, ms): a node whose bus was away while
//!   the others' was not reads which changes it did not hear (`told_since`).
//!
//! User ids have no `:`, so `{user}:{device}` reads back unambiguously. Each change of a
//! route is one script (atomic in Redis); the refresh of all of a node's routes is one
//! pipeline.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{RedisResult, Script};

use crate::gateway::hub::Connection;

/// Where a device is connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub node: u16,
    pub session: u64,
}

impl Route {
    /// What names the connection in a route's value: `{nodeId}:{sessionId}:`.
    fn id(&self) -> String {
        format!("{}:{}:", self.node, self.session)
    }

    /// Reads `{nodeId}:{sessionId}:{at}` (or an earlier release's `{nodeId}:{sessionId}`).
    fn decode(s: &str) -> Option<Route> {
        let (node, rest) = s.split_once(':')?;
        let session = rest.split_once(':').map_or(rest, |(session, _)| session);
        Some(Route {
            node: node.parse().ok()?,
            session: session.parse().ok()?,
        })
    }
}

/// What registering a device's route found.
#[derive(Debug)]
pub struct Registered {
    /// The route it replaced (the same device connected elsewhere, or earlier here).
    pub replaced: Option<Route>,
    /// The user's other devices with a live route.
    pub others: u32,
    /// The connection's place in the device's order (`at`), as written.
    pub at: u64,
}

/// What a refresh found for one connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Refreshed {
    /// The route was this connection's and still is.
    Held,
    /// The route was gone (it expired, another node took it out as a dead node's, or
    /// Redis restarted empty) and is written again.
    Written,
    /// An older connection of the device held the route (both were made while Redis was
    /// away); it is this one's now, and that one must close.
    TookOver(Route),
    /// A newer connection holds the route: this one was replaced and must close.
    Lost,
}

/// `at` of a route's value (`ARGV`-free helper, `0` for an earlier release's value).
macro_rules! route_at {
    () => {
        r"
local function route_at(v)
  return tonumber(string.match(v, '^%d+:%d+:(%d+)$')) or 0
end
"
    };
}

/// `now_ms()`: Redis's clock in Unix milliseconds.
macro_rules! now_ms {
    () => {
        r"
local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
"
    };
}

/// Writes the route (the new connection wins, always: its `at` is raised past the one it
/// replaces), notes it under the node, and counts the user's other live devices
/// (forgetting those whose route expired). KEYS: route, dev set, node's set. ARGV: device,
/// `{nodeId}:{sessionId}:`, ttl, `{user}:{device}`, the user's route-key prefix, the
/// connection's time, the time after which the node gave the call up (its clock, ms).
/// Returns the value replaced, the count and the `at` written; a count of -1 and nothing
/// written when it runs after that time: Redis hung with the call queued, and a call that
/// comes out of the queue is not the newest connection any more (the node, which gave it
/// up, writes the route by its refresh, ordered by `at`).
const REGISTER: &str = concat!(
    route_at!(),
    now_ms!(),
    r"
if now_ms() > tonumber(ARGV[7]) then
  return {'', -1, '0'}
end
local old = redis.call('GET', KEYS[1])
local at = tonumber(ARGV[6])
if old and route_at(old) >= at then at = route_at(old) + 1 end
redis.call('SET', KEYS[1], ARGV[2] .. string.format('%d', at), 'EX', ARGV[3])
local others = 0
for _, d in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if d ~= ARGV[1] then
    if redis.call('EXISTS', ARGV[5] .. d) == 1 then others = others + 1
    else redis.call('SREM', KEYS[2], d) end
  end
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[4])
return {old or '', others, string.format('%d', at)}
"
);

/// The end of a script that took a route out: removes the device (ARGV[1]) from the dev
/// set (KEYS[2]) and returns the user's live devices left, forgetting those whose route
/// expired (ARGV[4]: the user's route-key prefix).
macro_rules! devices_left {
    () => {
        r"
redis.call('SREM', KEYS[2], ARGV[1])
local left = 0
for _, d in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if redis.call('EXISTS', ARGV[4] .. d) == 1 then left = left + 1
  else redis.call('SREM', KEYS[2], d) end
end
return left
"
    };
}

/// Removes the route only if it is still this connection's; the user's live devices
/// left, or -1 if the route was not this connection's (a newer one holds it).
/// KEYS: route, dev set, node's set. ARGV: device, `{nodeId}:{sessionId}:`,
/// `{user}:{device}`, prefix.
const UNREGISTER: &str = concat!(
    r"
local cur = redis.call('GET', KEYS[1])
if not cur or string.sub(cur, 1, #ARGV[2]) ~= ARGV[2] then return -1 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], ARGV[3])",
    devices_left!()
);

/// Refreshes a route this connection holds (1); writes it again if it was gone (2); takes
/// it over from an older connection of the device (3, with the older one's value); or 0 if
/// a newer connection holds it. Older and newer go by `at`, then by the value (two
/// connections with one `at`: any order both nodes agree on).
/// KEYS: route, dev set, node's set. ARGV: device, `{nodeId}:{sessionId}:`, ttl,
/// `{user}:{device}`, `at`.
const REFRESH: &str = concat!(
    route_at!(),
    r"
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[2] .. ARGV[5]
local code = 2
if cur and string.sub(cur, 1, #ARGV[2]) == ARGV[2] then
  code = 1
  mine = cur
elseif cur then
  local theirs, at = route_at(cur), tonumber(ARGV[5])
  if theirs > at or (theirs == at and cur > mine) then return {0, cur} end
  code = 3
end
redis.call('SET', KEYS[1], mine, 'EX', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[4])
return {code, cur or ''}
"
);

/// Takes out a route this node wrote whose connection is gone (its removal failed while
/// Redis was away): the route only if this node still holds it. The user's live devices
/// left, or -1 if the route was not this node's.
/// KEYS: route, dev set, node's set. ARGV: device, `{nodeId}:`, `{user}:{device}`,
/// the user's route-key prefix.
const PRUNE: &str = concat!(
    r"
redis.call('SREM', KEYS[3], ARGV[3])
local cur = redis.call('GET', KEYS[1])
if not cur or string.sub(cur, 1, #ARGV[2]) ~= ARGV[2] then return -1 end
redis.call('DEL', KEYS[1])",
    devices_left!()
);

/// Every device route of each user: for each, its count, then (device, value) pairs
/// (value '' when the route expired). ARGV: prefix, users…
const LOOKUP: &str = r"
local out = {}
for i = 2, #ARGV do
  local u = ARGV[i]
  local devs = redis.call('SMEMBERS', ARGV[1] .. 'dev:' .. u)
  table.insert(out, #devs)
  if #devs > 0 then
    local keys = {}
    for j, d in ipairs(devs) do keys[j] = ARGV[1] .. 'route:' .. u .. ':' .. d end
    local vals = redis.call('MGET', unpack(keys))
    for j, d in ipairs(devs) do
      table.insert(out, d)
      table.insert(out, vals[j] or '')
    end
  end
end
return out
";

/// Keeps this node's lease: refreshed if it holds it, taken again if it lapsed (Redis
/// restarted); 0 if another instance holds the number. KEYS: lease, the node set.
/// ARGV: token, ttl, node.
const LEASE: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
return 1
";

/// Releases the lease if this instance holds it. KEYS: lease. ARGV: token.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
";

/// Records a presence about to be told: the value (KEYS[1], with an expiry), and, when it
/// differs from the value before or is told again anyway (ARGV[6] `1`), when (KEYS[2], a
/// sorted set of the last `TOLD_KEPT_MS`, at most `TOLD_KEPT` users). The value before.
/// ARGV: `1` or `0`, ttl, `TOLD_KEPT_MS`, `TOLD_KEPT`, the user, again.
const TOLD: &str = concat!(
    now_ms!(),
    r"
local previous = redis.call('SET', KEYS[1], ARGV[1], 'GET', 'EX', ARGV[2])
if previous ~= ARGV[1] or ARGV[6] == '1' then
  local ms = now_ms()
  redis.call('ZADD', KEYS[2], ms, ARGV[5])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ms - tonumber(ARGV[3]))
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -1 - tonumber(ARGV[4]))
end
return previous
"
);

/// The users told of in the last ARGV[1] ms (by Redis's clock), newest first, at most
/// ARGV[2]. KEYS: the `toldat` set.
const TOLD_SINCE: &str = concat!(
    now_ms!(),
    r"
return redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', now_ms() - tonumber(ARGV[1]), 'LIMIT', 0, ARGV[2])
"
);

/// How a presence told is kept in `p:told:{user}`.
fn told_value(online: bool) -> &'static str {
    if online { "1" } else { "0" }
}

/// A `p:told:{user}` as read back (`None`: not there, or not a value `told_value` writes).
fn told_read(value: Option<&str>) -> Option<bool> {
    match value {
        Some("1") => Some(true),
        Some("0") => Some(false),
        _ => None,
    }
}

/// How long, and for how many users at most, the presence changes told are kept in
/// `p:toldat` (`told_since` reads no further back).
pub const TOLD_KEPT_MS: u64 = 3_600_000;
pub const TOLD_KEPT: usize = 100_000;

/// Most users one lookup script reads (the rest go in further scripts of one pipeline).
pub(super) const LOOKUP_CHUNK: usize = 500;

pub struct Routes {
    redis: ConnectionManager,
    prefix: String,
    node: u16,
    ttl: u64,
    register: Script,
    unregister: Script,
    refresh: Script,
    prune: Script,
    lookup: Script,
    lease: Script,
    release: Script,
    told: Script,
    told_since: Script,
}

impl Routes {
    pub fn new(redis: ConnectionManager, prefix: &str, node: u16, ttl: Duration) -> Routes {
        Routes {
            redis,
            prefix: format!("{prefix}:"),
            node,
            ttl: ttl.as_secs().max(1),
            register: Script::new(REGISTER),
            unregister: Script::new(UNREGISTER),
            refresh: Script::new(REFRESH),
            prune: Script::new(PRUNE),
            lookup: Script::new(LOOKUP),
            lease: Script::new(LEASE),
            release: Script::new(RELEASE),
            told: Script::new(TOLD),
            told_since: Script::new(TOLD_SINCE),
        }
    }

    fn conn(&self) -> ConnectionManager {
        self.redis.clone()
    }

    /// Runs a pipeline of `script`'s invocations (by hash), loading the script first if
    /// Redis does not have it (a new or restarted Redis).
    async fn pipeline<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
        script: &Script,
    ) -> RedisResult<T> {
        match pipe.query_async(&mut self.conn()).await {
            Err(e) if e.to_string().contains("NoScript") => {
                script.load_async(&mut self.conn()).await?;
                pipe.query_async(&mut self.conn()).await
            }
            other => other,
        }
    }

    fn route_key(&self, user: &str, device: &str) -> String {
        format!("{}route:{user}:{device}", self.prefix)
    }

    fn route_prefix(&self, user: &str) -> String {
        format!("{}route:{user}:", self.prefix)
    }

    fn dev_key(&self, user: &str) -> String {
        format!("{}dev:{user}", self.prefix)
    }

    fn node_devices_key(&self, node: u16) -> String {
        format!("{}nodedev:{node}", self.prefix)
    }

    fn lease_key(&self, node: u16) -> String {
        format!("{}node:{node}", self.prefix)
    }

    /// What names this node's connection `session` in a route's value.
    fn mine(&self, session: u64) -> String {
        Route {
            node: self.node,
            session,
        }
        .id()
    }

    /// Writes the route of the connection `session`, made at `at` (Unix milliseconds), if
    /// Redis runs the call before `given_up` (Unix milliseconds): `None` if not.
    pub async fn register(
        &self,
        user: &str,
        device: &str,
        session: u64,
        at: u64,
        given_up: u64,
    ) -> RedisResult<Option<Registered>> {
        let (old, others, written): (String, i64, u64) = self
            .register
            .key(self.route_key(user, device))
            .key(self.dev_key(user))
            .key(self.node_devices_key(self.node))
            .arg(device)
            .arg(self.mine(session))
            .arg(self.ttl)
            .arg(format!("{user}:{device}"))
            .arg(self.route_prefix(user))
            .arg(at)
            .arg(given_up)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(u32::try_from(others).ok().map(|others| Registered {
            replaced: Route::decode(&old),
            others,
            at: written,
        }))
    }

    /// The user's live devices left, or `None` if a newer connection holds the route.
    pub async fn unregister(
        &self,
        user: &str,
        device: &str,
        session: u64,
    ) -> RedisResult<Option<u32>> {
        let left: i64 = self
            .unregister
            .key(self.route_key(user, device))
            .key(self.dev_key(user))
            .key(self.node_devices_key(self.node))
            .arg(device)
            .arg(self.mine(session))
            .arg(format!("{user}:{device}"))
            .arg(self.route_prefix(user))
            .invoke_async(&mut self.conn())
            .await?;
        Ok(u32::try_from(left).ok())
    }

    /// Refreshes every route of this node's connections in one pipeline: what each found,
    /// in the order of `connections`.
    pub async fn refresh(&self, connections: &[Connection]) -> RedisResult<Vec<Refreshed>> {
        let mut found = Vec::with_capacity(connections.len());
        for chunk in connections.chunks(1000) {
            let mut pipe = redis::pipe();
            for c in chunk {
                let mut inv = self.refresh.key(self.route_key(&c.user, &c.device));
                inv.key(self.dev_key(&c.user))
                    .key(self.node_devices_key(self.node))
                    .arg(&c.device)
                    .arg(self.mine(c.session))
                    .arg(self.ttl)
                    .arg(format!("{}:{}", c.user, c.device))
                    .arg(c.at);
                pipe.invoke_script(&inv);
            }
            let replies: Vec<(i64, String)> = self.pipeline(&pipe, &self.refresh).await?;
            found.extend(replies.into_iter().map(|(code, cur)| match code {
                1 => Refreshed::Held,
                2 => Refreshed::Written,
                3 => Route::decode(&cur).map_or(Refreshed::Written, Refreshed::TookOver),
                _ => Refreshed::Lost,
            }));
        }
        Ok(found)
    }

    /// Takes out the routes this node wrote whose connection is not among `connections`
    /// (read after this call began: a connection registered meanwhile is not taken for
    /// gone); the users left with no live device.
    pub async fn prune(
        &self,
        connections: impl FnOnce() -> Vec<Connection>,
    ) -> RedisResult<Vec<String>> {
        let written: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.node_devices_key(self.node))
            .query_async(&mut self.conn())
            .await?;
        let live: std::collections::HashSet<String> = connections()
            .into_iter()
            .map(|c| format!("{}:{}", c.user, c.device))
            .collect();
        let gone: Vec<&String> = written.iter().filter(|w| !live.contains(*w)).collect();
        let mut offline = Vec::new();
        for chunk in gone.chunks(1000) {
            let mut pipe = redis::pipe();
            let mut users = Vec::with_capacity(chunk.len());
            for w in chunk {
                let Some((user, device)) = w.split_once(':') else {
                    continue;
                };
                let mut inv = self.prune.key(self.route_key(user, device));
                inv.key(self.dev_key(user))
                    .key(self.node_devices_key(self.node))
                    .arg(device)
                    .arg(format!("{}:", self.node))
                    .arg(w.as_str())
                    .arg(self.route_prefix(user));
                pipe.invoke_script(&inv);
                users.push(user);
            }
            let left: Vec<i64> = self.pipeline(&pipe, &self.prune).await?;
            offline.extend(
                users
                    .into_iter()
                    .zip(left)
                    .filter(|(_, l)| *l == 0)
                    .map(|(u, _)| u.to_string()),
            );
        }
        offline.sort_unstable();
        offline.dedup();
        Ok(offline)
    }

    /// The live routes of each of `users` (by index): (device, route).
    pub async fn lookup(&self, users: &[&str]) -> RedisResult<Vec<Vec<(String, Route)>>> {
        let mut out = Vec::with_capacity(users.len());
        if users.is_empty() {
            return Ok(out);
        }
        let mut pipe = redis::pipe();
        for chunk in users.chunks(LOOKUP_CHUNK) {
            let mut inv = self.lookup.arg(&self.prefix);
            for u in chunk {
                inv.arg(*u);
            }
            pipe.invoke_script(&inv);
        }
        let replies: Vec<Vec<redis::Value>> = self.pipeline(&pipe, &self.lookup).await?;
        for reply in replies {
            let mut it = reply.into_iter();
            while let Some(n) = it.next() {
                let n: usize = redis::from_redis_value(n)?;
                let mut devices = Vec::with_capacity(n);
                for _ in 0..n {
                    let (Some(d), Some(v)) = (it.next(), it.next()) else {
                        break;
                    };
                    let device: String = redis::from_redis_value(d)?;
                    let value: String = redis::from_redis_value(v)?;
                    if let Some(route) = Route::decode(&value) {
                        devices.push((device, route));
                    }
                }
                out.push(devices);
            }
        }
        Ok(out)
    }

    /// Records that `user`'s friends are told `online` (and when, if that is a change or
    /// told `again`); what they were told before.
    pub async fn told(&self, user: &str, online: bool, again: bool) -> RedisResult<Option<bool>> {
        let previous: Option<String> = self
            .told
            .key(format!("{}told:{user}", self.prefix))
            .key(format!("{}toldat", self.prefix))
            .arg(told_value(online))
            .arg(self.ttl)
            .arg(TOLD_KEPT_MS)
            .arg(TOLD_KEPT)
            .arg(user)
            .arg(if again { "1" } else { "0" })
            .invoke_async(&mut self.conn())
            .await?;
        Ok(told_read(previous.as_deref()))
    }

    /// The users whose friends were told of their presence in the last `within` (by
    /// Redis's clock; at most `TOLD_KEPT_MS` back), newest first, at most `most`.
    pub async fn told_since(&self, within: Duration, most: usize) -> RedisResult<Vec<String>> {
        self.told_since
            .key(format!("{}toldat", self.prefix))
            .arg(within.as_millis() as u64)
            .arg(most)
            .invoke_async(&mut self.conn())
            .await
    }

    /// What the friends of each of `users` were last told (`None` once that expired,
    /// `route_ttl_secs` after it was told).
    pub async fn told_values(&self, users: &[String]) -> RedisResult<Vec<Option<bool>>> {
        if users.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = users
            .iter()
            .map(|u| format!("{}told:{u}", self.prefix))
            .collect();
        let values: Vec<Option<String>> = redis::cmd("MGET")
            .arg(keys)
            .query_async(&mut self.conn())
            .await?;
        Ok(values.iter().map(|v| told_read(v.as_deref())).collect())
    }

    /// Redis's clock less this process's monotonic clock (`clock::mono_ms`), in ms, and
    /// how long the call took: Redis's `TIME` set against the middle of the round trip,
    /// so off by at most half of it.
    pub async fn clock_offset(&self) -> RedisResult<(i64, Duration)> {
        let (sent, started) = (crate::clock::mono_ms(), std::time::Instant::now());
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut self.conn()).await?;
        let took = started.elapsed();
        let middle = sent + (took.as_millis() / 2) as i64;
        Ok((secs * 1000 + micros / 1000 - middle, took))
    }

    /// Claims this node's number: `Err(holder)` if a live instance holds it.
    pub async fn claim(&self, token: &str, ttl: Duration) -> RedisResult<Result<(), String>> {
        let mut conn = self.conn();
        let taken: Option<String> = redis::cmd("SET")
            .arg(self.lease_key(self.node))
            .arg(token)
            .arg("NX")
            .arg("EX")
            .arg(ttl.as_secs())
            .query_async(&mut conn)
            .await?;
        if taken.is_some() {
            let _: i64 = redis::cmd("SADD")
                .arg(format!("{}nodes", self.prefix))
                .arg(self.node)
                .query_async(&mut conn)
                .await?;
            return Ok(Ok(()));
        }
        let holder: Option<String> = redis::cmd("GET")
            .arg(self.lease_key(self.node))
            .query_async(&mut conn)
            .await?;
        Ok(Err(holder.unwrap_or_default()))
    }

    /// Keeps the lease; `false` if another instance holds this node's number.
    pub async fn keep_lease(&self, token: &str, ttl: Duration) -> RedisResult<bool> {
        let held: i64 = self
            .lease
            .key(self.lease_key(self.node))
            .key(format!("{}nodes", self.prefix))
            .arg(token)
            .arg(ttl.as_secs())
            .arg(self.node)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(held == 1)
    }

    pub async fn release(&self, token: &str) -> RedisResult<()> {
        let _: i64 = self
            .release
            .key(self.lease_key(self.node))
            .arg(token)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    /// Nodes that ran and whose lease lapsed: they died without taking their routes out.
    pub async fn dead_nodes(&self) -> RedisResult<Vec<u16>> {
        let mut conn = self.conn();
        let nodes: Vec<u16> = redis::cmd("SMEMBERS")
            .arg(format!("{}nodes", self.prefix))
            .query_async(&mut conn)
            .await?;
        let mut dead = Vec::new();
        for n in nodes.into_iter().filter(|n| *n != self.node) {
            let alive: bool = redis::cmd("EXISTS")
                .arg(self.lease_key(n))
                .query_async(&mut conn)
                .await?;
            if !alive {
                dead.push(n);
            }
        }
        Ok(dead)
    }

    /// Takes a dead node's routes out (one node does it: the first to claim the job) and
    /// forgets the node; the users it leaves with no live device.
    pub async fn reap(&self, dead: u16) -> RedisResult<Vec<String>> {
        let mut conn = self.conn();
        let claimed: Option<String> = redis::cmd("SET")
            .arg(format!("{}reap:{dead}", self.prefix))
            .arg(self.node)
            .arg("NX")
            .arg("EX")
            .arg(30)
            .query_async(&mut conn)
            .await?;
        if claimed.is_none() {
            return Ok(Vec::new());
        }
        let offline = self.take_out(dead).await?;
        let _: i64 = redis::cmd("SREM")
            .arg(format!("{}nodes", self.prefix))
            .arg(dead)
            .query_async(&mut conn)
            .await?;
        Ok(offline)
    }

    /// Takes out the routes this node's number holds from an earlier life (a restart
    /// claims the number as soon as the dead instance's lease lapses, before another node
    /// takes them out): called once the number is claimed and before any connection. The
    /// users it leaves with no live device.
    pub async fn take_out_previous(&self) -> RedisResult<Vec<String>> {
        self.take_out(self.node).await
    }

    /// Removes every route the node `dead` wrote that still names it, and its list of
    /// them; the users left with no live device.
    async fn take_out(&self, dead: u16) -> RedisResult<Vec<String>> {
        let mut conn = self.conn();
        let entries: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.node_devices_key(dead))
            .query_async(&mut conn)
            .await?;
        let mut users: HashMap<String, ()> = HashMap::new();
        for entry in &entries {
            let Some((user, device)) = entry.split_once(':') else {
                continue;
            };
            let route: Option<String> = redis::cmd("GET")
                .arg(self.route_key(user, device))
                .query_async(&mut conn)
                .await?;
            if route
                .as_deref()
                .and_then(Route::decode)
                .is_some_and(|r| r.node == dead)
            {
                let mut pipe = redis::pipe();
                pipe.cmd("DEL")
                    .arg(self.route_key(user, device))
                    .cmd("SREM")
                    .arg(self.dev_key(user))
                    .arg(device);
                let _: () = pipe.query_async(&mut conn).await?;
                users.insert(user.to_string(), ());
            }
        }
        let _: i64 = redis::cmd("DEL")
            .arg(self.node_devices_key(dead))
            .query_async(&mut conn)
            .await?;
        let users: Vec<String> = users.into_keys().collect();
        let refs: Vec<&str> = users.iter().map(String::as_str).collect();
        let routes = self.lookup(&refs).await?;
        Ok(users
            .into_iter()
            .zip(routes)
            .filter(|(_, r)| r.is_empty())
            .map(|(u, _)| u)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::Route;

    #[test]
    fn a_route_reads_with_its_time_and_without() {
        let r = Route {
            node: 3,
            session: 18_446_744_073_709_551_615,
        };
        assert_eq!(r.id(), "3:18446744073709551615:");
        assert_eq!(
            Route::decode("3:18446744073709551615:1796644204170"),
            Some(r.clone())
        );
        assert_eq!(Route::decode("3:18446744073709551615"), Some(r));
        assert_eq!(Route::decode("3"), None);
        assert_eq!(Route::decode(""), None);
        assert_eq!(Route::decode("x:1:2"), None);
    }
}
