//! `LockNode` over one real Redis master.
//!
//! Every step is one Lua script from `scripts/`. The steps of a lock's life (acquire,
//! confirm, renew, release, read) go through the master's batch (`store::batch`): the steps
//! concurrent requests send it meanwhile travel as one EVALSHA of `batch.lua`, which runs
//! each step's own script. Upkeep (list, probes, restore) is sent as calls of its own. One
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

use super::batch::{self, Batcher, Limits, Step};
use super::group;
use super::node::{
    Acquired, Announcement, Claim, Ending, Holding, ListPage, Listener, Listing, LockNode,
    NodeError, NodeResult, Owned, Probe, Renewal, SessionState, SessionStep,
};
use crate::config::MasterUrl;
use crate::model::News;
use crate::model::{FencingToken, Kind, LockKey, SessionHold, Traffic, claimant_of};

macro_rules! script {
    ($name:ident, $file:literal) => {
        static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!(concat!("scripts/", $file))));
    };
}
/// The steps that travel in batches, by the name `batch.lua` calls them.
const STEPS: [(&str, &str); 10] = [
    ("acquire", include_str!("scripts/acquire.lua")),
    ("confirm", include_str!("scripts/confirm.lua")),
    ("renew", include_str!("scripts/renew.lua")),
    ("release", include_str!("scripts/release.lua")),
    ("read", include_str!("scripts/read.lua")),
    ("slots", include_str!("scripts/slots.lua")),
    ("share", include_str!("scripts/share.lua")),
    ("acquire_many", include_str!("scripts/acquire_many.lua")),
    ("members", include_str!("scripts/members.lua")),
    ("session", include_str!("scripts/session.lua")),
];
static BATCH: LazyLock<Script> =
    LazyLock::new(|| Script::new(&batch::compose(&STEPS, include_str!("scripts/batch.lua"))));
script!(LIST, "list.lua");
script!(RESTORE, "restore.lua");
script!(UNMARK, "unmark.lua");
script!(WATERMARK, "watermark.lua");

/// The keys redlockd writes, all under the configured prefix.
#[derive(Debug, Clone)]
struct Keys {
    fence: String,
    marker: String,
    watermarks: String,
    names: String,
    lock_prefix: String,
    elections: String,
    election_prefix: String,
    semaphores: String,
    semaphore_prefix: String,
    readers: String,
    reader_prefix: String,
    /// Each lock's set of shared holders (`<this><segment><name>`).
    shared: String,
    /// Each lock's claim by a waiting exclusive grant (`<this><segment><name>`).
    claim: String,
    channel: String,
    events: String,
    idem: String,
    /// Each session's hash (`<this><session id>`).
    session: String,
}

impl Keys {
    fn new(prefix: &str) -> Self {
        Self {
            fence: format!("{prefix}fence"),
            marker: format!("{prefix}marker"),
            watermarks: format!("{prefix}watermarks"),
            names: format!("{prefix}{}", Kind::Mutex.index()),
            lock_prefix: format!("{prefix}{}", Kind::Mutex.segment()),
            elections: format!("{prefix}{}", Kind::Election.index()),
            election_prefix: format!("{prefix}{}", Kind::Election.segment()),
            semaphores: format!("{prefix}{}", Kind::Semaphore.index()),
            semaphore_prefix: format!("{prefix}{}", Kind::Semaphore.segment()),
            readers: format!("{prefix}{}", Kind::Reader.index()),
            reader_prefix: format!("{prefix}{}", Kind::Reader.segment()),
            shared: format!("{prefix}shared:"),
            claim: format!("{prefix}claim:"),
            channel: format!("{prefix}released"),
            events: format!("{prefix}events"),
            idem: format!("{prefix}idem:"),
            session: format!("{prefix}session:"),
        }
    }

    /// What a session's hash records of `hold` (see session.lua): what it is, then the keys
    /// that carry it.
    fn session_entry(&self, hold: &SessionHold) -> (String, Vec<String>) {
        let key = &hold.key;
        let mut keys = Vec::new();
        let mut entry = format!("{} {} {}", key.kind.word(), hold.token, key.name);
        let mut line = |tag: &str, k: String| {
            entry.push_str(&format!("\n{tag} {k}"));
            keys.push(k);
        };
        match key.kind {
            Kind::Group => {
                for member in key.members() {
                    line("k", self.lock(&member));
                }
            }
            Kind::Reader => {
                line("k", self.lock(key));
                line("s", self.shared(key));
            }
            Kind::Semaphore => line("k", self.lock(key)),
            Kind::Mutex | Kind::Election => {
                line("k", self.lock(key));
                line("c", self.claim(key));
            }
        }
        (entry, keys)
    }

    /// The key of `key` on the masters: prefix, kind segment, name.
    fn lock(&self, key: &LockKey) -> String {
        format!("{}{}", self.segment(key.kind), key.name)
    }

    /// The set of shared holders of the lock that `key` is (or is a shared hold of). Keys
    /// of other kinds never have shared holders; theirs name a set that is never written.
    fn shared(&self, key: &LockKey) -> String {
        let kind = match key.kind {
            Kind::Reader => Kind::Mutex,
            kind => kind,
        };
        format!("{}{}{}", self.shared, kind.segment(), key.owner_name())
    }

    /// The claim of a waiting exclusive grant on the lock that `key` is (or is a shared
    /// hold of).
    fn claim(&self, key: &LockKey) -> String {
        let kind = match key.kind {
            Kind::Reader => Kind::Mutex,
            kind => kind,
        };
        format!("{}{}{}", self.claim, kind.segment(), key.owner_name())
    }

    /// The prefix of the keys of the shared holds of the lock that `key` is.
    fn readers_of(&self, key: &LockKey) -> String {
        format!("{}{}/", self.reader_prefix, key.owner_name())
    }

    /// The prefix of every key of `kind`.
    fn segment(&self, kind: Kind) -> &str {
        match kind {
            Kind::Mutex => &self.lock_prefix,
            Kind::Election => &self.election_prefix,
            Kind::Semaphore => &self.semaphore_prefix,
            Kind::Reader => &self.reader_prefix,
            Kind::Group => &self.lock_prefix,
        }
    }

    /// The index of `kind`'s held names.
    fn index(&self, kind: Kind) -> &str {
        match kind {
            Kind::Mutex => &self.names,
            Kind::Election => &self.elections,
            Kind::Semaphore => &self.semaphores,
            Kind::Reader => &self.readers,
            Kind::Group => &self.names,
        }
    }
}

pub struct RedisNode {
    /// The URL without credentials: the only form that reaches logs, metrics, `/readyz`.
    address: String,
    client: redis::Client,
    conn: ConnectionManager,
    /// The master's queue of lock steps, sent several at a time.
    batch: Batcher,
    keys: Keys,
}

impl RedisNode {
    /// Set up (lazily: nothing is dialled until the first step) a node for the master at
    /// `url`. `timeout` bounds each connection attempt and each reply; a batch carries at
    /// most `batch_max` steps.
    pub fn new(
        url: &MasterUrl,
        key_prefix: &str,
        timeout: Duration,
        batch_max: usize,
    ) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(url.expose())?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(250))))
            // Keep trying to reconnect, at most a second apart, so that a master that comes
            // back is used again within about a second.
            .set_max_delay(Duration::from_secs(1))
            .set_number_of_retries(usize::MAX);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
        Ok(Self {
            address: url.redacted().to_owned(),
            client,
            batch: Batcher::new(
                conn.clone(),
                &BATCH,
                classify,
                Limits {
                    timeout,
                    max_steps: batch_max,
                },
            ),
            conn,
            keys: Keys::new(key_prefix),
        })
    }
}

/// Classify a client error by its kind, never by its message.
fn classify(e: redis::RedisError) -> NodeError {
    use redis::{ErrorKind, ServerErrorKind};
    if e.is_timeout() {
        NodeError::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        NodeError::Connection(e.to_string())
    } else {
        match e.kind() {
            // Still loading its data after a restart: as good as not there yet.
            ErrorKind::Server(ServerErrorKind::BusyLoading) => NodeError::Connection(e.to_string()),
            ErrorKind::Server(
                ServerErrorKind::ResponseError
                | ServerErrorKind::ExecAbort
                | ServerErrorKind::NoScript,
            ) => NodeError::Script(e.to_string()),
            _ => NodeError::Other(e.to_string()),
        }
    }
}

/// A session's hold as session.lua answers it: '<lease>\n<kind> <token> <key name>\n...'.
fn parse_hold(text: &str) -> Option<SessionHold> {
    let mut lines = text.lines();
    let lease = lines.next()?.to_owned();
    let mut what = lines.next()?.splitn(3, ' ');
    let kind = Kind::from_word(what.next()?)?;
    let token = what.next()?.parse().ok()?;
    let name = what.next()?;
    Some(SessionHold {
        key: LockKey {
            kind,
            name: name.into(),
        },
        lease,
        token,
    })
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

    /// A count or token: a negative one means the data on the master is corrupt, which is
    /// an error, never a silent 0.
    fn uint(&self, i: usize) -> NodeResult<u64> {
        let v = self.int(i)?;
        u64::try_from(v).map_err(|_| {
            NodeError::Script(format!("expected a non-negative integer at {i}, got {v}"))
        })
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

    /// A holding as read.lua, list.lua and slots.lua write it from `at`: lease, token, TTL,
    /// what is left of it, owner.
    fn holding(&self, at: usize) -> NodeResult<Holding> {
        Ok(Holding {
            lease: self.string(at)?,
            token: self.uint(at + 1)?,
            ttl_ms: self.uint(at + 2)?,
            pttl_ms: self.uint(at + 3)?,
            owner: self.owner(at + 4)?,
        })
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
    /// One step of a lock's life, sent with whatever else is queued for this master.
    async fn step(&self, step: Step) -> NodeResult<Reply> {
        Reply::of(self.batch.send(step).await?)
    }

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

    async fn acquire(&self, claim: Claim<'_>) -> NodeResult<Acquired> {
        let key = claim.key;
        let mut step;
        if key.kind == Kind::Group {
            step = Step::new("acquire_many");
            step.key(&self.keys.fence)
                .key(&self.keys.marker)
                .key(&self.keys.names);
            let members = key.members();
            for member in &members {
                step.key(self.keys.lock(member))
                    .key(self.keys.shared(member))
                    .key(self.keys.claim(member));
            }
            step.arg(claim.lease)
                .arg(claim.ttl_ms)
                .arg(claim.owner.unwrap_or(""))
                .arg(claim.listeners.flags())
                .arg(&self.keys.lock_prefix)
                .arg(&*key.name)
                .arg(claimant_of(claim.lease))
                .arg(&self.keys.reader_prefix)
                .arg(claim.listeners.patience_ms);
            for member in &members {
                step.arg(&*member.name);
            }
        } else if key.kind == Kind::Reader {
            step = Step::new("share");
            step.key(self.keys.lock(key))
                .key(&self.keys.fence)
                .key(&self.keys.marker)
                .key(self.keys.index(key.kind))
                .key(self.keys.lock(&LockKey::mutex(key.owner_name())))
                .key(self.keys.shared(key))
                .key(self.keys.claim(key));
        } else {
            step = Step::new("acquire");
            step.key(self.keys.lock(key))
                .key(&self.keys.fence)
                .key(&self.keys.marker)
                .key(self.keys.index(key.kind))
                .key(self.keys.shared(key))
                .key(self.keys.claim(key));
        }
        if key.kind != Kind::Group {
            step.arg(claim.lease)
                .arg(claim.ttl_ms)
                .arg(claim.owner.unwrap_or(""))
                .arg(&*key.name)
                .arg(self.keys.segment(key.kind))
                .arg(claim.listeners.flags())
                .arg(self.keys.readers_of(key))
                .arg(claim.listeners.patience_ms);
            if key.kind != Kind::Reader {
                step.arg(claim.lock_delay_ms);
            }
        }
        if let Some(idem) = claim.idem {
            step.key(format!("{}{}", self.keys.idem, idem.record))
                .arg(&idem.fingerprint)
                .arg(&idem.attempt);
        }
        let reply = self.step(step).await?;
        match reply.status()? {
            1 => Ok(Acquired::Granted {
                token: reply.uint(1)?,
            }),
            -2 => Ok(Acquired::Mismatch),
            -3 => Ok(Acquired::Ended),
            -4 => Ok(Acquired::Delayed {
                pttl_ms: reply.uint(1)?,
            }),
            _ => Ok(Acquired::Held {
                pttl_ms: reply.uint(1)?,
                lease: reply.string(2)?,
            }),
        }
    }

    async fn confirm(&self, key: &LockKey, lease: &str, token: u64) -> NodeResult<()> {
        if key.kind == Kind::Group {
            return group::confirm(self, key, lease, token).await;
        }
        let mut step = Step::new("confirm");
        step.key(self.keys.lock(key))
            .key(&self.keys.fence)
            .key(&self.keys.marker)
            .arg(lease)
            .arg(token);
        let reply = self.step(step).await?;
        reply.status().map(drop)
    }

    async fn renew(&self, renewal: Renewal<'_>) -> NodeResult<Owned<Holding>> {
        if renewal.key.kind == Kind::Group {
            return group::renew(self, renewal).await;
        }
        let (lease, ttl_ms) = (renewal.lease, renewal.ttl_ms);
        let mut step = Step::new("renew");
        step.key(self.keys.lock(renewal.key))
            .key(&self.keys.marker)
            .key(self.keys.claim(renewal.key));
        if renewal.key.kind == Kind::Reader {
            step.key(self.keys.shared(renewal.key));
        }
        step.arg(lease);
        match ttl_ms {
            Some(ttl) => step.arg(ttl),
            None => step.arg(""),
        };
        if let Some(owner) = renewal.owner {
            step.arg(owner);
        }
        let reply = self.step(step).await?;
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

    async fn release(&self, key: &LockKey, lease: &str, ending: &Ending) -> NodeResult<Owned<()>> {
        if key.kind == Kind::Group {
            return group::release(self, key, lease, ending).await;
        }
        let (announce, attempt) = match ending {
            Ending::Revoke => ("1", ""),
            Ending::Evict => ("2", ""),
            Ending::Undo { attempt } => ("0", attempt.as_deref().unwrap_or("")),
        };
        let mut step = Step::new("release");
        step.key(self.keys.lock(key))
            .key(&self.keys.marker)
            .key(self.keys.claim(key));
        if key.kind == Kind::Reader {
            step.key(self.keys.shared(key));
        }
        step.arg(lease)
            .arg(&self.keys.channel)
            .arg(announce)
            .arg(&self.keys.events)
            .arg(&*key.topic())
            .arg(attempt);
        let reply = self.step(step).await?;
        Ok(match reply.status()? {
            1 => Owned::Yes(()),
            _ => Owned::NotOwner,
        })
    }

    async fn read(&self, key: &LockKey) -> NodeResult<Vec<Holding>> {
        if key.kind == Kind::Group {
            return group::read(self, key).await;
        }
        let mut step = Step::new("read");
        step.key(self.keys.lock(key)).key(&self.keys.marker);
        let reply = self.step(step).await?;
        if reply.status()? == 0 {
            return Ok(Vec::new());
        }
        Ok(vec![reply.holding(1)?])
    }

    async fn session(&self, id: &str, step: SessionStep<'_>) -> NodeResult<Owned<SessionState>> {
        let mut call = Step::new("session");
        call.key(format!("{}{id}", self.keys.session))
            .key(&self.keys.marker);
        match step {
            SessionStep::Open { ttl_ms, owner } => {
                call.arg("open").arg(ttl_ms).arg(owner.unwrap_or(""));
            }
            SessionStep::Renew { ttl_ms } => {
                call.arg("renew");
                match ttl_ms {
                    Some(ttl) => call.arg(ttl),
                    None => call.arg(""),
                };
            }
            SessionStep::Read => {
                call.arg("read");
            }
            SessionStep::End => {
                call.arg("end");
            }
            SessionStep::Attach { hold } => {
                let (entry, keys) = self.keys.session_entry(hold);
                for key in keys {
                    call.key(key);
                }
                call.arg("attach").arg(&hold.lease).arg(entry);
            }
        }
        let reply = self.step(call).await?;
        match reply.status()? {
            0 => return Ok(Owned::NotOwner),
            2 => return Ok(Owned::Yes(SessionState::default())),
            _ => {}
        }
        let mut state = SessionState {
            pttl_ms: reply.uint(1)?,
            ttl_ms: reply.uint(2)?,
            owner: reply.owner(3)?,
            holds: Vec::new(),
            carried: Vec::new(),
            attached: matches!(step, SessionStep::Attach { .. }),
        };
        if matches!(step, SessionStep::Renew { .. }) {
            for at in 4..reply.0.len() {
                state.carried.push(reply.string(at)?);
            }
            return Ok(Owned::Yes(state));
        }
        for at in 4..reply.0.len() {
            let text = reply.string(at)?;
            state
                .holds
                .push(parse_hold(&text).ok_or_else(|| {
                    NodeError::Script(format!("a session's hold reads {text:?}"))
                })?);
        }
        Ok(Owned::Yes(state))
    }

    async fn list(&self, listing: Listing<'_>) -> NodeResult<ListPage> {
        let (kind, after, limit) = (listing.kind, listing.after, listing.limit);
        // Each name looked at costs the master a hash read: a few thousand keep one call to
        // milliseconds, well inside the response timeout, however large the keyspace.
        let budget = limit.saturating_mul(4).clamp(100, 4000);
        let reply = self
            .run(
                LIST.key(self.keys.index(kind))
                    .key(&self.keys.marker)
                    .arg(self.keys.segment(kind))
                    .arg(after)
                    .arg(listing.prefix)
                    .arg(limit)
                    .arg(budget),
            )
            .await?;
        let more = reply.status()? == 1;
        let last = Some(reply.string(1)?).filter(|l| !l.is_empty() && l != after);
        let mut locks = Vec::new();
        let mut at = 2;
        while at < reply.0.len() {
            locks.push((reply.string(at)?, reply.holding(at + 1)?));
            at += 6;
        }
        Ok(ListPage { locks, more, last })
    }

    async fn members(&self, key: &LockKey, lease: &str) -> NodeResult<Option<String>> {
        let mut step = Step::new("members");
        step.key(self.keys.lock(key))
            .key(&self.keys.marker)
            .arg(lease);
        let reply = self.step(step).await?;
        if reply.status()? == 0 {
            return Ok(None);
        }
        Ok(Some(reply.string(1)?))
    }

    async fn slots(&self, name: &str, limit: u16) -> NodeResult<Vec<(u16, Holding)>> {
        let mut step = Step::new("slots");
        step.key(&self.keys.marker)
            .arg(format!("{}{name}/", self.keys.semaphore_prefix))
            .arg(limit);
        let reply = self.step(step).await?;
        reply.status()?;
        let mut held = Vec::new();
        let mut at = 1;
        while at < reply.0.len() {
            let slot = u16::try_from(reply.uint(at)?)
                .map_err(|_| NodeError::Script(format!("slot out of range at {at}")))?;
            held.push((slot, reply.holding(at + 1)?));
            at += 6;
        }
        Ok(held)
    }

    async fn probe(&self) -> NodeResult<Probe> {
        let mut conn = self.conn.clone();
        let (info, marker, fence, watermarks): (
            String,
            Option<String>,
            Option<u64>,
            Vec<(String, u64)>,
        ) = redis::pipe()
            .cmd("INFO")
            .arg("server")
            .cmd("GET")
            .arg(&self.keys.marker)
            .cmd("GET")
            .arg(&self.keys.fence)
            .cmd("HGETALL")
            .arg(&self.keys.watermarks)
            .query_async(&mut conn)
            .await
            .map_err(classify)?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        Ok(Probe {
            run_id: field("run_id:"),
            marker,
            fence: fence.unwrap_or(0),
            watermarks,
            uptime: Duration::from_secs(field("uptime_in_seconds:").parse().unwrap_or(0)),
        })
    }

    async fn restore(&self, fence: u64, identity: &str) -> NodeResult<()> {
        self.run(
            RESTORE
                .key(&self.keys.fence)
                .key(&self.keys.marker)
                .arg(fence)
                .arg(identity),
        )
        .await
        .map(drop)
    }

    async fn unmark(&self, identity: &str) -> NodeResult<()> {
        self.run(UNMARK.key(&self.keys.marker).arg(identity))
            .await
            .map(drop)
    }

    async fn record_watermarks(&self, seen: &[(String, u64)]) -> NodeResult<()> {
        if seen.is_empty() {
            return Ok(());
        }
        let mut invocation = WATERMARK.key(&self.keys.watermarks);
        for (identity, fence) in seen {
            invocation.arg(identity).arg(*fence);
        }
        self.run(&invocation).await.map(drop)
    }

    async fn announce(&self, key: &LockKey, news: News, token: u64) -> NodeResult<()> {
        let mut publish = redis::cmd("PUBLISH");
        publish
            .arg(&self.keys.events)
            .arg(format!("{} {token} {}", news.verb(), key.topic()));
        let mut conn = self.conn.clone();
        publish
            .query_async::<i64>(&mut conn)
            .await
            .map(drop)
            .map_err(classify)
    }

    fn traffic(&self) -> Option<Traffic> {
        Some(self.batch.traffic())
    }

    fn listen(&self, listener: Listener, shutdown: CancellationToken) {
        let client = self.client.clone();
        let channels = Channels {
            released: self.keys.channel.clone(),
            events: self.keys.events.clone(),
        };
        let address = self.address.clone();
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(100);
            let mut first = true;
            loop {
                let session = subscribe_and_forward(&client, &channels, &listener, first);
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    subscribed = session => {
                        match subscribed {
                            Ok(()) => backoff = Duration::from_millis(100),
                            Err(e) => tracing::debug!(master = %address, error = %e, "announcement subscription lost; reconnecting"),
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

/// How often the announcement subscription is pinged. A subscription whose connection the
/// server closed does not end on its own; a failed ping is how it is noticed.
const SUBSCRIPTION_PING: Duration = Duration::from_secs(1);

/// An announcement from the events channel; `None` for one this version does not know.
fn parse_event(payload: &str) -> Option<Announcement<'_>> {
    let mut parts = payload.splitn(3, ' ');
    let (kind, token, name) = (parts.next()?, parts.next()?.parse().ok()?, parts.next()?);
    let token = FencingToken(token);
    match kind {
        "acquired" => Some(Announcement::Acquired(name, token)),
        "released" => Some(Announcement::Released(name, token)),
        "evicted" => Some(Announcement::Evicted(name, token)),
        "proclaimed" => Some(Announcement::Proclaimed(name, token)),
        _ => None,
    }
}

/// The pub/sub channels the replicas announce on.
struct Channels {
    /// A revoke's release: the message is the lock name. (Its name and format predate the
    /// events channel and stay, so that replicas of different versions still wake each
    /// other's waiters.)
    released: String,
    /// `acquired <token> <name>` (a grant decided on a majority), `released <token>
    /// <name>` (a revoke) and `proclaimed <token> <name>` (a leader's new value); `<name>`
    /// is the key's topic.
    events: String,
}

/// Subscribe to the announcement channels and hand every message to `listener` until the
/// connection fails. After a re-subscription, announcements may have been missed
/// meanwhile: the listener is told so.
async fn subscribe_and_forward(
    client: &redis::Client,
    channels: &Channels,
    listener: &Listener,
    first: bool,
) -> Result<(), redis::RedisError> {
    let timed_out = || redis::RedisError::from((redis::ErrorKind::Io, "subscription timed out"));
    let pubsub = tokio::time::timeout(Duration::from_secs(2), client.get_async_pubsub())
        .await
        .map_err(|_| timed_out())??;
    let (mut sink, mut messages) = pubsub.split();
    tokio::time::timeout(
        Duration::from_secs(2),
        sink.subscribe(&[&channels.released, &channels.events]),
    )
    .await
    .map_err(|_| timed_out())??;
    if !first {
        listener(Announcement::Missed);
    }
    let mut ping = tokio::time::interval(SUBSCRIPTION_PING);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = messages.next() => match msg {
                Some(msg) => {
                    let Ok(payload) = msg.get_payload::<String>() else { continue };
                    if msg.get_channel_name() == channels.released {
                        listener(Announcement::Freed(&payload));
                    } else if let Some(announced) = parse_event(&payload) {
                        listener(announced);
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
