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

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt as _;
use redis::aio::ConnectionManager;
use redis::{Script, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::batch::{self, Batcher, Limits, Step};
use super::clock::{self, ClockStatus, ClockWatch, Reading};
use super::cluster::{self, Cluster, ShardPolicy};
use super::group;
use super::layout::{self, Keys};
use super::node::{
    Acquired, Announcement, Claim, Ending, FenceSource, HeldPage, Holding, ListPage, Listener,
    Listing, LockNode, LostShard, NodeError, NodeReport, NodeResult, NodeRules, Owned, Probe,
    Renewal, SessionState, SessionStep,
};
use crate::config::MasterUrl;
use crate::model::News;
use crate::model::{
    FencingToken, Kind, LeaseId, LockKey, Owner, SessionHold, Traffic, claimant_of,
};

/// How many keys one page of `held.lua` looks at: about a millisecond of the master's time,
/// which a grant's step may wait behind. Larger pages read faster and hold grants up
/// longer (docs/performance.md, "A quarantine's read of the holds").
const HELD_PAGE: u64 = 200;

mod announce;
mod reply;
mod sessions;
pub(crate) mod steps;

pub(crate) use reply::held_page;
use reply::{
    Reply, acquired, confirmed, delay_left, held_slots, holders, member_names, page, released,
    renewed,
};

macro_rules! script {
    ($name:ident, $file:literal) => {
        static $name: LazyLock<Script> =
            LazyLock::new(|| Script::new(include_str!(concat!("scripts/", $file))));
    };
    // A script that reads or writes what a master keeps: after `layout.lua`, which it
    // asks whether this release knows the master's data layout.
    ($name:ident, $file:literal, layout) => {
        static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!(
                include_str!("scripts/layout.lua"),
                include_str!(concat!("scripts/", $file))
            ))
        });
    };
    // An upkeep script that also uses the steps' shared functions (`prelude.lua`).
    ($name:ident, $file:literal, layout, prelude) => {
        static $name: LazyLock<Script> = LazyLock::new(|| {
            Script::new(concat!(
                include_str!("scripts/layout.lua"),
                include_str!("scripts/prelude.lua"),
                include_str!(concat!("scripts/", $file))
            ))
        });
    };
}
/// The steps that travel in batches, by the name `batch.lua` calls them.
const STEPS: [(&str, &str); 11] = [
    ("acquire", include_str!("scripts/acquire.lua")),
    ("confirm", include_str!("scripts/confirm.lua")),
    ("renew", include_str!("scripts/renew.lua")),
    ("release", include_str!("scripts/release.lua")),
    ("read", include_str!("scripts/read.lua")),
    ("delay", include_str!("scripts/delay.lua")),
    ("slots", include_str!("scripts/slots.lua")),
    ("share", include_str!("scripts/share.lua")),
    ("acquire_many", include_str!("scripts/acquire_many.lua")),
    ("members", include_str!("scripts/members.lua")),
    ("session", include_str!("scripts/session.lua")),
];
static BATCH: LazyLock<Script> =
    LazyLock::new(|| Script::new(&batch::compose(&STEPS, include_str!("scripts/batch.lua"))));

/// Each batched step's script as a call of its own (`batch::single`): how a cluster sends
/// its steps, which are not batched.
static SINGLES: LazyLock<Vec<(&'static str, Script)>> = LazyLock::new(|| {
    STEPS
        .iter()
        .map(|&(name, body)| (name, Script::new(&batch::single(body))))
        .collect()
});

/// The script that runs the step `name` as a call of its own.
fn single_script(name: &str) -> Option<&'static Script> {
    SINGLES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, script)| script)
}

/// The script a cluster sends the step `name` as (`single.lua` after the step's own), for
/// the benchmark's look inside Redis.
#[doc(hidden)]
pub fn single_script_text(name: &str) -> Option<String> {
    STEPS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, body)| batch::single(body))
}

/// The batch script in its two parts (the step functions, then `batch.lua`), with the steps
/// named in `replace` given those bodies in place of their own scripts: for the benchmark's
/// look inside Redis, which weighs what dealing steps out costs against what the steps do.
/// The service runs the parts joined, with every step's own script.
#[doc(hidden)]
pub fn batch_script_parts(replace: &[(&str, &str)]) -> (String, String) {
    let steps: Vec<(&str, &str)> = STEPS
        .iter()
        .map(|&(name, body)| {
            let body = replace
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(body, |&(_, b)| b);
            (name, body)
        })
        .collect();
    (
        batch::definitions(&steps),
        include_str!("scripts/batch.lua").to_owned(),
    )
}
script!(LIST, "list.lua", layout, prelude);
script!(RESTORE, "restore.lua", layout);
script!(UNMARK, "unmark.lua", layout);
script!(VERIFIED, "verified.lua", layout);
script!(WATERMARK, "watermark.lua", layout);
script!(CLOCKS, "clocks.lua");
script!(HELD, "held.lua");

/// The upkeep script a step of that name runs (`steps::list`, `restore`, ...).
fn upkeep_script(name: &str) -> Option<&'static Script> {
    Some(match name {
        "list" => &LIST,
        "restore" => &RESTORE,
        "unmark" => &UNMARK,
        "verified" => &VERIFIED,
        "watermark" => &WATERMARK,
        "clocks" => &CLOCKS,
        _ => return None,
    })
}

/// A single master's connections.
struct Master {
    client: redis::Client,
    conn: ConnectionManager,
    batch: Batcher,
    /// Read with every batch's answer and every probe (`store::clock`).
    clock: Arc<ClockWatch>,
}

/// How a node's steps reach Redis.
enum Wire {
    /// One master: the steps travel in its batches; upkeep goes as calls of its own.
    Master(Box<Master>),
    /// A Redis Cluster: each step to the primary of its slot (`store::cluster`).
    Cluster(Arc<Cluster>),
}

pub struct RedisNode {
    /// The URL without credentials: the only form that reaches logs, metrics, `/readyz`.
    address: String,
    wire: Wire,
    keys: Keys,
    /// Whether this process hears the master's announcements now (every channel
    /// subscribed): until then, and after a subscription drops, waiters on this replica
    /// are woken by releases elsewhere only when they look again. `/readyz` shows it.
    subscribed: Arc<std::sync::atomic::AtomicBool>,
}

impl RedisNode {
    /// Set up (lazily: nothing is dialled until the first step) a node for the master at
    /// `url`. `timeout` bounds each connection attempt and each reply; a batch carries at
    /// most `batch_max` steps. A `redis+cluster://` URL is a cluster held to the default
    /// `ShardPolicy`; `with_policy` names one.
    pub fn new(
        url: &MasterUrl,
        key_prefix: &str,
        timeout: Duration,
        batch_max: usize,
    ) -> Result<Self, redis::RedisError> {
        Self::with_policy(url, key_prefix, timeout, batch_max, ShardPolicy::default())
    }

    /// As `new`, with the quarantine a cluster's shards are held to.
    pub(crate) fn with_policy(
        url: &MasterUrl,
        key_prefix: &str,
        timeout: Duration,
        batch_max: usize,
        policy: ShardPolicy,
    ) -> Result<Self, redis::RedisError> {
        let keys = Keys::new(key_prefix, url.is_cluster());
        if url.is_cluster() {
            let cluster =
                Cluster::new(url.expose(), keys.clone(), timeout, policy).map_err(|e| {
                    redis::RedisError::from((
                        redis::ErrorKind::InvalidClientConfig,
                        "a cluster's URL",
                        e,
                    ))
                })?;
            return Ok(Self {
                address: url.redacted().to_owned(),
                wire: Wire::Cluster(Arc::new(cluster)),
                keys,
                subscribed: Default::default(),
            });
        }
        let client = redis::Client::open(url.expose())?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(250))))
            // Keep trying to reconnect, at most a second apart, so that a master that comes
            // back is used again within about a second.
            .set_max_delay(Duration::from_secs(1))
            .set_number_of_retries(usize::MAX);
        let conn = ConnectionManager::new_lazy_with_config(client.clone(), config)?;
        let clock = Arc::new(ClockWatch::new(policy.clock));
        Ok(Self {
            address: url.redacted().to_owned(),
            wire: Wire::Master(Box::new(Master {
                client,
                batch: Batcher::new(
                    conn.clone(),
                    &BATCH,
                    classify,
                    Limits {
                        timeout,
                        max_steps: batch_max,
                    },
                    clock.clone(),
                ),
                conn,
                clock,
            })),
            keys,
            subscribed: Default::default(),
        })
    }

    /// The cluster behind this node, when it is one.
    pub(crate) fn cluster(&self) -> Option<&Cluster> {
        match &self.wire {
            Wire::Cluster(cluster) => Some(cluster),
            Wire::Master(_) => None,
        }
    }
}

/// Classify a client error by its kind, never by its message.
fn classify(e: redis::RedisError) -> NodeError {
    cluster::classify(&e)
}

/// A session's hold as session.lua answers it: '<lease>\n<kind> <token> <key name>\n...'.
fn parse_hold(text: &str) -> Option<SessionHold> {
    let mut lines = text.lines();
    let lease = LeaseId::stored(lines.next()?);
    let mut what = lines.next()?.splitn(3, ' ');
    let kind = Kind::from_word(what.next()?)?;
    let token = FencingToken::new(what.next()?.parse().ok()?);
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

impl RedisNode {
    /// One step of a lock's life: on a master, sent with whatever else is queued for it; on
    /// a cluster, to the primary of its first key's slot (every key of a step shares it), as
    /// a call of its own script (`single.lua`), since a batch's keys would span slots.
    async fn step(&self, step: Step) -> NodeResult<Reply> {
        match &self.wire {
            Wire::Master(master) => Reply::of(master.batch.send(step).await?),
            Wire::Cluster(cluster) => {
                let slot = step.first_key().map_or(0, layout::slot_of);
                let script = single_script(step.name())
                    .ok_or_else(|| NodeError::Other(format!("no step script {}", step.name())))?;
                let call = step.evalsha(script);
                Reply::of(batch::single_answer(
                    cluster.call(slot, &call, script, 1).await?,
                )?)
            }
        }
    }

    /// An upkeep script's step on a single master, as a call of its own.
    async fn run(&self, step: &Step) -> NodeResult<Reply> {
        let Wire::Master(master) = &self.wire else {
            return Err(NodeError::Other(
                "a cluster's upkeep goes shard by shard".into(),
            ));
        };
        let script = upkeep_script(step.name())
            .ok_or_else(|| NodeError::Other(format!("no upkeep script {}", step.name())))?;
        let mut conn = master.conn.clone();
        let value: Value = step
            .invocation(script)
            .invoke_async(&mut conn)
            .await
            .map_err(classify)?;
        Reply::of(value)
    }

    /// A cluster's grant of several names, whose keys span slots: the names of each slot are
    /// one acquire_many step there, slot after slot; the first that is not granted undoes
    /// the ones before it and is the answer. The token is the largest of the slots'.
    async fn acquire_across_slots(&self, claim: Claim<'_>) -> NodeResult<Acquired> {
        let members = claim.key.members();
        let mut by_slot: Vec<(u16, Vec<LockKey>)> = Vec::new();
        for member in members {
            let slot = self.keys.slot(&member);
            match by_slot.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, names)) => names.push(member),
                None => by_slot.push((slot, vec![member])),
            }
        }
        if by_slot.len() == 1 {
            return self.acquire_group(claim, &by_slot[0].1).await;
        }
        let mut token = FencingToken::default();
        let mut done: Vec<&[LockKey]> = Vec::new();
        let mut tokens = Vec::new();
        for (_, names) in &by_slot {
            match self.acquire_group(claim, names).await {
                Ok(Acquired::Granted { token: t }) => {
                    token = token.max(t);
                    done.push(names);
                    tokens.push(t);
                }
                other => {
                    self.undo_members(&claim, &done).await;
                    return other;
                }
            }
        }
        // The engine takes a master whose answer is the chosen token to hold it already: so
        // every slot's counter is raised to the largest here, as one counter would be.
        for (names, t) in done.iter().zip(tokens) {
            if t == token {
                continue;
            }
            for name in *names {
                if let Err(e) = self.confirm(name, claim.lease, token).await {
                    self.undo_members(&claim, &done).await;
                    return Err(e);
                }
            }
        }
        Ok(Acquired::Granted { token })
    }

    /// Undo what a several-name grant took in the slots it was granted before one failed.
    async fn undo_members(&self, claim: &Claim<'_>, done: &[&[LockKey]]) {
        let ending = Ending::Undo {
            attempt: claim.idem.map(|i| Arc::from(i.attempt.as_str())),
        };
        for name in done.iter().flat_map(|names| names.iter()) {
            let _ = self.release(name, claim.lease, &ending).await;
        }
    }

    /// acquire_many.lua for `names` (all of `claim`'s names, or those of one slot).
    async fn acquire_group(&self, claim: Claim<'_>, names: &[LockKey]) -> NodeResult<Acquired> {
        let first = names
            .first()
            .ok_or_else(|| NodeError::Other("a several-name grant without names".into()))?;
        let step = steps::acquire_many(&self.keys, &claim, names, first);
        let reply = self.step(step).await?;
        let acquired = acquired(&reply)?;
        if let (Acquired::Granted { token }, Some(cluster)) = (&acquired, self.cluster()) {
            cluster.saw(self.keys.slot(first), token.get());
        }
        Ok(acquired)
    }
}

impl RedisNode {
    /// A page of a cluster's held locks: no index spans its slots, so every shard is
    /// scanned for the kind's keys (the cost of a page grows with the keys on the cluster),
    /// and the page's names are read where they live.
    async fn list_by_scan(&self, listing: Listing<'_>) -> NodeResult<ListPage> {
        let Some(cluster) = self.cluster() else {
            return Err(NodeError::Other(
                "only a cluster is listed by scanning".into(),
            ));
        };
        let (pattern, head) = self.keys.scan_pattern(listing.kind, listing.prefix);
        let mut names: Vec<String> = cluster
            .scan(&pattern)
            .await?
            .iter()
            .filter_map(|key| {
                let (owner, tail) = key.get(head..)?.split_once('}')?;
                Some(format!("{owner}{tail}"))
            })
            .filter(|name| name.as_str() > listing.after && name.starts_with(listing.prefix))
            .collect();
        names.sort_unstable();
        names.dedup();
        let more = names.len() > listing.limit;
        names.truncate(listing.limit);
        let reads = futures::future::join_all(names.iter().map(|name| {
            self.read_one(LockKey {
                kind: listing.kind,
                name: name.as_str().into(),
            })
        }))
        .await;
        let mut locks = Vec::new();
        for (name, read) in names.iter().zip(reads) {
            if let Some(holding) = read?.into_iter().next() {
                locks.push((name.clone(), holding));
            }
        }
        Ok(ListPage {
            locks,
            more,
            last: names.last().cloned(),
        })
    }

    /// `read` of one key (a several-name lease's member keys are listed one by one).
    async fn read_one(&self, key: LockKey) -> NodeResult<Vec<Holding>> {
        holders(&self.step(steps::read(&self.keys, &key)).await?)
    }
}

#[async_trait]
impl LockNode for RedisNode {
    fn address(&self) -> &str {
        &self.address
    }

    async fn acquire(&self, claim: Claim<'_>) -> NodeResult<Acquired> {
        let key = claim.key;
        if key.kind == Kind::Group {
            return if self.cluster().is_some() {
                self.acquire_across_slots(claim).await
            } else {
                self.acquire_group(claim, &key.members()).await
            };
        }
        let step = steps::acquire(&self.keys, &claim);
        let acquired = acquired(&self.step(step).await?)?;
        if let (Acquired::Granted { token }, Some(cluster)) = (&acquired, self.cluster()) {
            cluster.saw(self.keys.slot(key), token.get());
        }
        Ok(acquired)
    }

    async fn confirm(&self, key: &LockKey, lease: &LeaseId, token: FencingToken) -> NodeResult<()> {
        if key.kind == Kind::Group {
            return group::confirm(self, key, lease, token).await;
        }
        confirmed(
            &self
                .step(steps::confirm(&self.keys, key, lease, token))
                .await?,
        )?;
        if let Some(cluster) = self.cluster() {
            cluster.saw(self.keys.slot(key), token.get());
        }
        Ok(())
    }

    async fn renew(&self, renewal: Renewal<'_>) -> NodeResult<Owned<Holding>> {
        if renewal.key.kind == Kind::Group {
            return group::renew(self, renewal).await;
        }
        let step = steps::renew(&self.keys, &renewal);
        renewed(&self.step(step).await?, renewal.lease)
    }

    async fn release(
        &self,
        key: &LockKey,
        lease: &LeaseId,
        ending: &Ending,
    ) -> NodeResult<Owned<()>> {
        if key.kind == Kind::Group {
            return group::release(self, key, lease, ending).await;
        }
        let step = steps::release(&self.keys, key, lease, ending);
        released(&self.step(step).await?)
    }

    async fn read(&self, key: &LockKey) -> NodeResult<Vec<Holding>> {
        if key.kind == Kind::Group {
            return group::read(self, key).await;
        }
        holders(&self.step(steps::read(&self.keys, key)).await?)
    }

    async fn session(&self, id: &str, step: SessionStep<'_>) -> NodeResult<Owned<SessionState>> {
        self.session_step(id, step).await
    }

    async fn list(&self, listing: Listing<'_>) -> NodeResult<ListPage> {
        let (kind, after, limit) = (listing.kind, listing.after, listing.limit);
        // Each name looked at costs the master a hash read: a few thousand keep one call to
        // milliseconds, well inside the response timeout, however large the keyspace.
        let budget = limit.saturating_mul(4).clamp(100, 4000);
        let Some((index, segment)) = self.keys.index(kind) else {
            return self.list_by_scan(listing).await;
        };
        let step = steps::list(&self.keys, index, segment, &listing, budget);
        page(&self.run(&step).await?, after)
    }

    async fn lock_delay(&self, key: &LockKey) -> NodeResult<Option<Duration>> {
        if key.kind == Kind::Group {
            // A several-name lease takes no lock-delay.
            return Ok(None);
        }
        delay_left(&self.step(steps::delay(&self.keys, key)).await?)
    }

    async fn members(&self, key: &LockKey, lease: &LeaseId) -> NodeResult<Option<String>> {
        member_names(&self.step(steps::members(&self.keys, key, lease)).await?)
    }

    async fn slots(&self, name: &str, limit: u16) -> NodeResult<Vec<(u16, Holding)>> {
        held_slots(&self.step(steps::slots(&self.keys, name, limit)).await?)
    }

    async fn probe(&self) -> NodeResult<Probe> {
        let conn = match &self.wire {
            Wire::Master(master) => &master.conn,
            Wire::Cluster(cluster) => {
                let probe = cluster.probe(&RESTORE, &VERIFIED).await?;
                return Ok(Probe {
                    // A shard's restart is judged shard by shard (store::cluster).
                    run_id: "cluster".into(),
                    marker: probe.identity,
                    fence: probe.fence,
                    watermarks: Vec::new(),
                    uptime: probe.uptime.unwrap_or_default(),
                    run_record: None,
                    // A shard's layout key is per slot: its steps say when it is refused.
                    unknown_layout: None,
                });
            }
        };
        let mut conn = conn.clone();
        // A master that does not know the batch script (new, restarted, or flushed) is
        // given it now, so that the first grant after does not wait on the upload and the
        // compile of it (three round trips, about 60 KB) inside its master timeout. Beside
        // the probe, not in it: the probe's time and answer are the master's health, and a
        // batch still loads the script itself when the master asks for it.
        let mut loader = conn.clone();
        tokio::spawn(async move {
            let loaded: redis::RedisResult<Vec<bool>> = redis::cmd("SCRIPT")
                .arg("EXISTS")
                .arg(BATCH.get_hash())
                .query_async(&mut loader)
                .await;
            if matches!(loaded.as_deref(), Ok([false])) {
                let _: redis::RedisResult<String> =
                    BATCH.prepare_invoke().load_async(&mut loader).await;
            }
        });
        let sent = Instant::now();
        let (info, marker, fence, watermarks, time, clocks, layout, run_record): (
            String,
            Option<String>,
            Option<u64>,
            Vec<(String, u64)>,
            Value,
            Vec<(String, String)>,
            Option<String>,
            Option<String>,
        ) = redis::pipe()
            .cmd("INFO")
            .arg("server")
            .cmd("GET")
            .arg(self.keys.master_marker())
            .cmd("GET")
            .arg(self.keys.master_fence())
            .cmd("HGETALL")
            .arg(self.keys.watermarks())
            .cmd("TIME")
            .cmd("HGETALL")
            .arg(self.keys.clocks())
            .cmd("GET")
            .arg(self.keys.master_layout())
            .cmd("GET")
            .arg(self.keys.master_run())
            .query_async(&mut conn)
            .await
            .map_err(classify)?;
        // An idle master's clock is watched too: a jump is seen before the next grant. The
        // monitor acts on what the watch saw (`LockNode::clock`), so the probe still answers.
        if let (Wire::Master(master), Some(master_us)) = (&self.wire, clock::parse_time(&time)) {
            let records: Vec<(i64, i64)> = clocks
                .iter()
                .filter_map(|(_, record)| {
                    let (offset, at) = record.split_once(' ')?;
                    Some((offset.parse().ok()?, at.parse().ok()?))
                })
                .collect();
            let _ = master.clock.observe_vouched(
                Reading {
                    sent,
                    received: Instant::now(),
                    master_us,
                    local_us: clock::wall_us(),
                },
                &records,
            );
        }
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
            unknown_layout: layout.filter(|l| l != super::layout::LAYOUT),
            run_record,
        })
    }

    async fn restore(&self, fence: u64, identity: &str, run_id: Option<&str>) -> NodeResult<()> {
        if let Some(cluster) = self.cluster() {
            return cluster.restore_all(fence, identity, &RESTORE).await;
        }
        let (fence_key, marker_key) = (self.keys.master_fence(), self.keys.master_marker());
        self.run(&steps::restore(
            fence_key, marker_key, fence, identity, run_id,
        ))
        .await
        .map(drop)
    }

    async fn durable(&self) -> NodeResult<bool> {
        let Wire::Master(master) = &self.wire else {
            // A shard's restart is judged with its slots' markers (store::cluster).
            return Ok(false);
        };
        cluster::durable(&master.conn).await
    }

    async fn record_run(&self, identity: &str, run_id: &str) -> NodeResult<()> {
        if self.cluster().is_some() {
            return Ok(());
        }
        self.run(&steps::verified(
            self.keys.master_marker(),
            identity,
            run_id,
        ))
        .await
        .map(drop)
    }

    async fn unmark(&self, identity: &str) -> NodeResult<()> {
        if let Some(cluster) = self.cluster() {
            return cluster.unmark_all(identity, &UNMARK).await;
        }
        self.run(&steps::unmark(self.keys.master_marker(), identity))
            .await
            .map(drop)
    }

    async fn record_watermarks(&self, seen: &[(String, u64)]) -> NodeResult<()> {
        // A cluster keeps its shards' high-water marks itself (store::cluster), and the
        // counter it reports never falls: nothing to record there.
        if seen.is_empty() || self.keys.is_cluster() {
            return Ok(());
        }
        self.run(&steps::watermarks(&self.keys, seen))
            .await
            .map(drop)
    }

    async fn announce(&self, key: &LockKey, news: News, token: FencingToken) -> NodeResult<()> {
        let message = format!("{} {token} {}", news.verb(), key.topic());
        match &self.wire {
            Wire::Master(master) => {
                let mut publish = redis::cmd("PUBLISH");
                publish.arg(&*self.keys.events(key)).arg(message);
                let mut conn = master.conn.clone();
                publish
                    .query_async::<i64>(&mut conn)
                    .await
                    .map(drop)
                    .map_err(classify)
            }
            Wire::Cluster(cluster) => {
                let mut publish = redis::cmd("SPUBLISH");
                publish.arg(&*self.keys.events(key)).arg(message);
                cluster
                    .command::<i64>(self.keys.slot(key), &publish)
                    .await
                    .map(drop)
            }
        }
    }

    async fn record_clock(&self, id: &str, offset_us: i64) -> NodeResult<()> {
        if self.keys.is_cluster() {
            return Ok(());
        }
        self.run(&steps::clock(&self.keys, id, offset_us))
            .await
            .map(drop)
    }

    async fn longest_delay(&self) -> NodeResult<Option<Duration>> {
        let Wire::Master(master) = &self.wire else {
            return Ok(None);
        };
        let mut conn = master.conn.clone();
        let pattern = self.keys.claims_pattern();
        let mut cursor: u64 = 0;
        let mut longest: i64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(classify)?;
            if !keys.is_empty() {
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
                }
                let replies: Vec<Value> = pipe.query_async(&mut conn).await.map_err(classify)?;
                for pair in replies.chunks(2) {
                    // Only a lock-delay's claim ('d:<lease>', acquire.lua) says how long a
                    // delay runs; a waiting grant's claim says nothing of the kind.
                    if let [Value::BulkString(value), Value::Int(pttl)] = pair
                        && value.starts_with(b"d:")
                    {
                        longest = longest.max(*pttl);
                    }
                }
            }
            if next == 0 {
                return Ok(Some(Duration::from_millis(
                    u64::try_from(longest).unwrap_or(0),
                )));
            }
            cursor = next;
        }
    }

    async fn held(&self, cursor: u64) -> NodeResult<Option<HeldPage>> {
        let pattern = self.keys.every_key_pattern();
        let master = match &self.wire {
            Wire::Master(master) => master,
            Wire::Cluster(cluster) => {
                return cluster.held(cursor, &HELD, &pattern, HELD_PAGE).await;
            }
        };
        let mut conn = master.conn.clone();
        let reply: Vec<Value> = HELD
            .prepare_invoke()
            .arg(cursor)
            .arg(pattern)
            .arg(HELD_PAGE)
            .invoke_async(&mut conn)
            .await
            .map_err(classify)?;
        held_page(reply).map(Some)
    }

    fn lost_shards(&self) -> Vec<LostShard> {
        match &self.wire {
            Wire::Master(_) => Vec::new(),
            Wire::Cluster(cluster) => cluster.lost_shards(),
        }
    }

    fn shorten_shard(&self, shard: &LostShard, left: Duration, outstanding: usize) {
        if let Wire::Cluster(cluster) = &self.wire {
            cluster.shorten_shard(shard, left, outstanding);
        }
    }

    fn clock(&self) -> Option<ClockStatus> {
        match &self.wire {
            Wire::Master(master) => Some(master.clock.status()),
            Wire::Cluster(_) => None,
        }
    }

    fn settle_clock(&self) {
        if let Wire::Master(master) = &self.wire {
            master.clock.settle();
        }
    }

    fn rules(&self) -> NodeRules {
        match self.cluster() {
            Some(_) => NodeRules {
                upkeep_budget: Some(cluster::UPKEEP_BUDGET),
                fences: FenceSource::Clock,
            },
            None => NodeRules::default(),
        }
    }

    fn report(&self) -> NodeReport {
        NodeReport {
            shards: self.cluster().map(|cluster| cluster.status()),
        }
    }

    fn traffic(&self) -> Option<Traffic> {
        match &self.wire {
            Wire::Master(master) => Some(master.batch.traffic()),
            Wire::Cluster(_) => None,
        }
    }

    fn subscribed(&self) -> Option<bool> {
        Some(self.subscribed.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn listen(&self, listener: Listener, shutdown: CancellationToken) {
        self.listen_for_announcements(listener, shutdown);
    }
}
