//! `LockNode` over one real Redis master.
//!
//! Every step is one Lua script from `scripts/`, loaded once and sent with EVALSHA (redis-rs
//! loads the script and retries on NOSCRIPT, e.g. after the master restarted). One
//! `ConnectionManager` per master carries all commands: it pipelines concurrent callers
//! over a single connection (far faster than a pool's checkout-per-call here) and
//! reconnects by itself when the master drops it. A second connection per master listens
//! for release announcements.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use redis::aio::ConnectionManager;
use redis::{Script, Value};
use tokio_util::sync::CancellationToken;

use crate::redlock::node::{
    Acquired, Holding, LockNode, NodeError, NodeResult, Owned, Probe, ReleaseListener,
};

macro_rules! script {
    ($name:ident, $file:literal) => {
        static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!(concat!("scripts/", $file))));
    };
}
script!(ACQUIRE, "acquire.lua");
script!(CONFIRM, "confirm.lua");
script!(RENEW, "renew.lua");
script!(RELEASE, "release.lua");
script!(READ, "read.lua");
script!(RESTORE, "restore.lua");

/// The keys redlockd writes, all under the configured prefix.
#[derive(Debug, Clone)]
struct Keys {
    prefix: String,
    fence: String,
    marker: String,
    channel: String,
}

impl Keys {
    fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
            fence: format!("{prefix}fence"),
            marker: format!("{prefix}marker"),
            channel: format!("{prefix}released"),
        }
    }

    fn lock(&self, name: &str) -> String {
        format!("{}lock:{name}", self.prefix)
    }

    /// A SCAN pattern for lock keys starting with `name_prefix`. Lock names cannot hold
    /// glob characters, but the configured key prefix might.
    fn lock_pattern(&self, name_prefix: &str) -> String {
        let mut pattern = String::new();
        for c in self.lock("").chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push_str(name_prefix);
        pattern.push('*');
        pattern
    }
}

pub struct RedisNode {
    /// The URL without credentials: the only form that reaches logs, metrics, `/readyz`.
    address: String,
    client: redis::Client,
    conn: ConnectionManager,
    keys: Keys,
}

/// The URL as it may be shown: scheme, host, port and database, never user or password.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(parsed) => {
            let host = parsed.host_str().unwrap_or("?");
            let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}://{host}{port}{}", parsed.scheme(), parsed.path())
        }
        Err(_) => "<unparsable url>".to_owned(),
    }
}

impl RedisNode {
    /// Set up (lazily: nothing is dialled until the first step) a node for the master at
    /// `url`. `timeout` bounds each connection attempt and each reply.
    pub fn new(url: &str, key_prefix: &str, timeout: Duration) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(url)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(250))))
            // Keep trying to reconnect, at most a second apart, so that a master that comes
            // back is used again within about a second.
            .set_max_delay(Duration::from_secs(1))
            .set_number_of_retries(usize::MAX);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
        Ok(Self {
            address: redact(url),
            client,
            conn,
            keys: Keys::new(key_prefix),
        })
    }
}

fn classify(e: redis::RedisError) -> NodeError {
    if e.is_timeout() {
        NodeError::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        NodeError::Connection(e.to_string())
    } else if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
        || format!("{e}").contains("script")
    {
        NodeError::Script(e.to_string())
    } else {
        NodeError::Other(e.to_string())
    }
}

/// Reads the loosely typed replies of our scripts.
struct Reply(Vec<Value>);

impl Reply {
    fn of(value: Value) -> NodeResult<Self> {
        match value {
            Value::Array(items) => Ok(Self(items)),
            Value::Int(i) => Ok(Self(vec![Value::Int(i)])),
            other => Err(NodeError::Script(format!("unexpected reply {other:?}"))),
        }
    }

    fn int(&self, i: usize) -> NodeResult<i64> {
        match self.0.get(i) {
            Some(Value::Int(v)) => Ok(*v),
            other => Err(NodeError::Script(format!(
                "expected an integer at {i}, got {other:?}"
            ))),
        }
    }

    fn uint(&self, i: usize) -> NodeResult<u64> {
        Ok(u64::try_from(self.int(i)?).unwrap_or(0))
    }

    fn string(&self, i: usize) -> NodeResult<String> {
        match self.0.get(i) {
            Some(Value::BulkString(bytes)) => Ok(String::from_utf8_lossy(bytes).into_owned()),
            Some(Value::SimpleString(s)) => Ok(s.clone()),
            other => Err(NodeError::Script(format!(
                "expected a string at {i}, got {other:?}"
            ))),
        }
    }

    fn owner(&self, i: usize) -> NodeResult<Option<String>> {
        Ok(Some(self.string(i)?).filter(|o| !o.is_empty()))
    }

    /// The status every script puts first: -1 means the master lost its marker.
    fn status(&self) -> NodeResult<i64> {
        match self.int(0)? {
            -1 => Err(NodeError::Amnesic),
            s => Ok(s),
        }
    }
}

impl RedisNode {
    async fn run(&self, invocation: &redis::ScriptInvocation<'_>) -> NodeResult<Reply> {
        let mut conn = self.conn.clone();
        let value: Value = invocation.invoke_async(&mut conn).await.map_err(classify)?;
        Reply::of(value)
    }
}

#[async_trait]
impl LockNode for RedisNode {
    fn address(&self) -> &str {
        &self.address
    }

    async fn acquire(
        &self,
        name: &str,
        lease: &str,
        ttl_ms: u64,
        owner: Option<&str>,
    ) -> NodeResult<Acquired> {
        let reply = self
            .run(
                ACQUIRE
                    .key(self.keys.lock(name))
                    .key(&self.keys.fence)
                    .key(&self.keys.marker)
                    .arg(lease)
                    .arg(ttl_ms)
                    .arg(owner.unwrap_or("")),
            )
            .await?;
        match reply.status()? {
            1 => Ok(Acquired::Granted {
                token: reply.uint(1)?,
            }),
            _ => Ok(Acquired::Held {
                pttl_ms: reply.uint(1)?,
            }),
        }
    }

    async fn confirm(&self, name: &str, lease: &str, token: u64) -> NodeResult<()> {
        let reply = self
            .run(
                CONFIRM
                    .key(self.keys.lock(name))
                    .key(&self.keys.fence)
                    .key(&self.keys.marker)
                    .arg(lease)
                    .arg(token),
            )
            .await?;
        reply.status().map(drop)
    }

    async fn renew(
        &self,
        name: &str,
        lease: &str,
        ttl_ms: Option<u64>,
    ) -> NodeResult<Owned<Holding>> {
        let ttl = ttl_ms.map(|t| t.to_string()).unwrap_or_default();
        let reply = self
            .run(
                RENEW
                    .key(self.keys.lock(name))
                    .key(&self.keys.marker)
                    .arg(lease)
                    .arg(ttl),
            )
            .await?;
        if reply.status()? == 0 {
            return Ok(Owned::NotOwner);
        }
        Ok(Owned::Yes(Holding {
            lease: lease.to_owned(),
            token: reply.uint(1)?,
            ttl_ms: reply.uint(2)?,
            pttl_ms: reply.uint(3)?,
            owner: reply.owner(4)?,
        }))
    }

    async fn release(&self, name: &str, lease: &str) -> NodeResult<Owned<()>> {
        let reply = self
            .run(
                RELEASE
                    .key(self.keys.lock(name))
                    .key(&self.keys.marker)
                    .arg(lease)
                    .arg(&self.keys.channel)
                    .arg(name),
            )
            .await?;
        Ok(match reply.status()? {
            1 => Owned::Yes(()),
            _ => Owned::NotOwner,
        })
    }

    async fn read(&self, name: &str) -> NodeResult<Option<Holding>> {
        let reply = self
            .run(READ.key(self.keys.lock(name)).key(&self.keys.marker))
            .await?;
        if reply.status()? == 0 {
            return Ok(None);
        }
        Ok(Some(Holding {
            lease: reply.string(1)?,
            token: reply.uint(2)?,
            ttl_ms: reply.uint(3)?,
            pttl_ms: reply.uint(4)?,
            owner: reply.owner(5)?,
        }))
    }

    async fn list(&self, prefix: &str, cap: usize) -> NodeResult<Vec<(String, Holding)>> {
        let mut conn = self.conn.clone();
        let marked: bool = redis::cmd("EXISTS")
            .arg(&self.keys.marker)
            .query_async(&mut conn)
            .await
            .map_err(classify)?;
        if !marked {
            return Err(NodeError::Amnesic);
        }
        let pattern = self.keys.lock_pattern(prefix);
        let mut keys = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(classify)?;
            keys.extend(batch);
            cursor = next;
            if cursor == 0 || keys.len() >= cap {
                break;
            }
        }
        keys.truncate(cap);
        if keys.is_empty() {
            // An empty pipeline is an error to redis-rs, not an empty answer.
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("HMGET")
                .arg(key)
                .arg(&["lease", "token", "ttl", "owner"][..]);
            pipe.cmd("PTTL").arg(key);
        }
        let values: Vec<Value> = pipe.query_async(&mut conn).await.map_err(classify)?;
        let lock_prefix = self.keys.lock("");
        let mut out = Vec::with_capacity(keys.len());
        for (key, pair) in keys.iter().zip(values.chunks(2)) {
            let [Value::Array(fields), Value::Int(pttl)] = pair else {
                continue;
            };
            let fields = Reply(fields.clone());
            // A key that expired between SCAN and HMGET has no fields.
            let (Ok(lease), Ok(token)) = (fields.string(0), fields.string(1)) else {
                continue;
            };
            let Some(name) = key.strip_prefix(&lock_prefix) else {
                continue;
            };
            out.push((
                name.to_owned(),
                Holding {
                    lease,
                    token: token.parse().unwrap_or(0),
                    ttl_ms: fields
                        .string(2)
                        .ok()
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(0),
                    pttl_ms: u64::try_from(*pttl).unwrap_or(0),
                    owner: fields.owner(3).ok().flatten(),
                },
            ));
        }
        Ok(out)
    }

    async fn probe(&self) -> NodeResult<Probe> {
        let mut conn = self.conn.clone();
        let (info, marked, fence): (String, bool, Option<u64>) = redis::pipe()
            .cmd("INFO")
            .arg("server")
            .cmd("EXISTS")
            .arg(&self.keys.marker)
            .cmd("GET")
            .arg(&self.keys.fence)
            .query_async(&mut conn)
            .await
            .map_err(classify)?;
        let run_id = info
            .lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .unwrap_or_default()
            .trim()
            .to_owned();
        Ok(Probe {
            run_id,
            marked,
            fence: fence.unwrap_or(0),
        })
    }

    async fn restore(&self, fence: u64) -> NodeResult<()> {
        self.run(
            RESTORE
                .key(&self.keys.fence)
                .key(&self.keys.marker)
                .arg(fence),
        )
        .await
        .map(drop)
    }

    fn listen_for_releases(&self, listener: ReleaseListener, shutdown: CancellationToken) {
        let client = self.client.clone();
        let channel = self.keys.channel.clone();
        let address = self.address.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            let mut first = true;
            loop {
                let session = subscribe_and_forward(&client, &channel, &listener, first);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    subscribed = session => {
                        match subscribed {
                            Ok(()) => backoff = Duration::from_millis(100),
                            Err(e) => tracing::debug!(master = %address, error = %e, "release subscription lost; reconnecting"),
                        }
                        first = false;
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        });
    }
}

/// How often the release subscription is pinged. A subscription whose connection the
/// server closed does not end on its own; a failed ping is how it is noticed.
const SUBSCRIPTION_PING: Duration = Duration::from_secs(1);

/// Subscribe to the release channel and hand every message to `listener` until the
/// connection fails. After a re-subscription, releases may have been missed meanwhile:
/// every waiter is told to look again.
async fn subscribe_and_forward(
    client: &redis::Client,
    channel: &str,
    listener: &ReleaseListener,
    first: bool,
) -> Result<(), redis::RedisError> {
    let timed_out =
        || redis::RedisError::from((redis::ErrorKind::Io, "release subscription timed out"));
    let pubsub = tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub())
        .await
        .map_err(|_| timed_out())??;
    let (mut sink, mut messages) = pubsub.split();
    tokio::time::timeout(Duration::from_secs(2), sink.subscribe(channel))
        .await
        .map_err(|_| timed_out())??;
    if !first {
        listener(None);
    }
    let mut ping = tokio::time::interval(SUBSCRIPTION_PING);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = messages.next() => match msg {
                Some(msg) => {
                    if let Ok(name) = msg.get_payload::<String>() {
                        listener(Some(&name));
                    }
                }
                None => return Ok(()),
            },
            _ = ping.tick() => {
                tokio::time::timeout(Duration::from_secs(2), sink.ping::<Value>())
                    .await
                    .map_err(|_| timed_out())??;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_drops_credentials() {
        assert_eq!(
            redact("redis://:s3cret@127.0.0.1:7000/0"),
            "redis://127.0.0.1:7000/0"
        );
        assert_eq!(
            redact("rediss://user:pw@cache.internal:6380"),
            "rediss://cache.internal:6380"
        );
        assert!(!redact("redis://u:hunter2@h:1").contains("hunter2"));
    }

    #[test]
    fn scan_pattern_escapes_the_key_prefix() {
        let keys = Keys::new("app[1]*:");
        assert_eq!(keys.lock_pattern("inv"), r"app\[1\]\*:lock:inv*");
    }
}
