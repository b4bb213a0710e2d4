//! Where redlockd's data lives on a master: the name of every key and channel a step uses.
//!
//! Two layouts. A single master's is the one every version has written: one fencing
//! counter, one marker, one index of names per kind, and the lock keys under them. A Redis
//! Cluster's puts every key one step touches in one hash slot: each key of a lock carries
//! the lock's name as its hash tag (`redlockd:lock:{a}`), and the fencing counter, the
//! marker and the announcement channels are one per slot, named by a tag that hashes to
//! that slot (`redlockd:fence{3w}`). So a step's script is served by the one shard that
//! owns the name, a shard's lost data shows in every script on its slots at once, and no
//! shard takes every `INCR`. A cluster keeps no index of names (an index spans slots);
//! listing scans each shard instead.
//!
//! Both are layout 1. A master names its layout in `<marker>:layout` (none: 1), which every
//! step reads with the marker (`scripts/prelude.lua`), as do the upkeep scripts that read
//! or write what a master keeps, and refuses when it is another (`scripts/layout.lua`): a
//! later release that changes what the masters keep raises it, and this release's calls
//! then fail rather than misread or overwrite what that release wrote (docs/operations.md,
//! "Upgrades and rolling deploys").

use std::borrow::Cow;
use std::sync::LazyLock;

use crate::model::{Kind, LockKey, SessionHold};

/// The data layout this release reads and writes (what `layout.lua` names `LAYOUT`).
pub(crate) const LAYOUT: &str = "1";

/// What `/readyz` says of a master that keeps `layout`, one this release does not know.
pub(crate) fn unknown(layout: &str) -> String {
    format!(
        "this master keeps data layout {layout}, which this release of redlockd does not know (it knows {LAYOUT})"
    )
}

/// How many hash slots a Redis Cluster has.
pub(crate) const SLOTS: u16 = 16384;

/// The hash slot of `key`, by Redis Cluster's rule: CRC16 of its hash tag (the text between
/// the first `{` and the next `}`, when not empty) or of the whole key.
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % SLOTS
}

/// For every slot, a short tag that hashes to it: the per-slot keys and channels are named
/// with it, so that each lives in the slot of the names it serves.
static SLOT_TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let mut tags: Vec<Option<String>> = vec![None; usize::from(SLOTS)];
    let mut missing = usize::from(SLOTS);
    let mut i: u64 = 0;
    while missing > 0 {
        let tag = format!("{i:x}");
        let slot = &mut tags[usize::from(slot_of(&tag))];
        if slot.is_none() {
            *slot = Some(tag);
            missing -= 1;
        }
        i += 1;
    }
    tags.into_iter().flatten().collect()
});

/// The tag that hashes to `slot`.
pub fn slot_tag(slot: u16) -> &'static str {
    &SLOT_TAGS[usize::from(slot % SLOTS)]
}

/// The keys redlockd writes, all under the configured prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
    /// The cluster layout (see the module's doc).
    cluster: bool,
    fence: String,
    marker: String,
    watermarks: String,
    clocks: String,
    channel: String,
    events: String,
    /// A single master's index of each kind's names, and its names' key prefix, by
    /// `Kind::index` word.
    indexes: Vec<(&'static str, String, String)>,
}

impl Keys {
    /// The layout of a single master (`cluster: false`) or of a Redis Cluster.
    pub(crate) fn new(prefix: &str, cluster: bool) -> Self {
        Self {
            prefix: prefix.to_owned(),
            cluster,
            fence: format!("{prefix}fence"),
            marker: format!("{prefix}marker"),
            watermarks: format!("{prefix}watermarks"),
            clocks: format!("{prefix}clocks"),
            channel: format!("{prefix}released"),
            events: format!("{prefix}events"),
            indexes: Kind::ALL
                .into_iter()
                .map(|kind| {
                    (
                        kind.index(),
                        format!("{prefix}{}", kind.index()),
                        format!("{prefix}{}", kind.segment()),
                    )
                })
                .collect(),
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The lock name a key's data is tagged with: a shared hold's or a permit's lock.
    fn tag<'a>(&self, key: &'a LockKey) -> &'a str {
        key.owner_name()
    }

    /// `<prefix><part><name>`, with the name as the hash tag in the cluster layout.
    fn named(&self, part: &str, name: &str, rest: &str) -> String {
        if self.cluster {
            format!("{}{part}{{{name}}}{rest}", self.prefix)
        } else {
            format!("{}{part}{name}{rest}", self.prefix)
        }
    }

    /// The hash slot of `key`'s data (meaningful in the cluster layout).
    pub(crate) fn slot(&self, key: &LockKey) -> u16 {
        slot_of(&self.lock(key))
    }

    /// The key of `key` on the masters: prefix, kind segment, name.
    pub(crate) fn lock(&self, key: &LockKey) -> String {
        let owner = self.tag(key);
        self.named(key.kind.segment(), owner, &key.name[owner.len()..])
    }

    /// The set of shared holders of the lock that `key` is (or is a shared hold of). Keys
    /// of other kinds never have shared holders; theirs name a set that is never written.
    pub(crate) fn shared(&self, key: &LockKey) -> String {
        self.named(
            &format!("shared:{}", lock_kind(key.kind).segment()),
            self.tag(key),
            "",
        )
    }

    /// The claim of a waiting exclusive grant (or a lock-delay) on the lock that `key` is
    /// (or is a shared hold of).
    pub(crate) fn claim(&self, key: &LockKey) -> String {
        self.named(
            &format!("claim:{}", lock_kind(key.kind).segment()),
            self.tag(key),
            "",
        )
    }

    /// A SCAN pattern for every name's claim key on a single master (the prefix's glob
    /// characters escaped).
    pub(crate) fn claims_pattern(&self) -> String {
        self.pattern("claim:*")
    }

    /// A SCAN pattern for every key redlockd writes on a single master.
    pub(crate) fn every_key_pattern(&self) -> String {
        self.pattern("*")
    }

    /// The prefix with its glob characters escaped, then `glob`.
    fn pattern(&self, glob: &str) -> String {
        let mut pattern = String::new();
        for c in self.prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push_str(glob);
        pattern
    }

    /// The prefix of the keys of the shared holds of the lock that `key` is.
    pub(crate) fn readers_of(&self, key: &LockKey) -> String {
        self.named(Kind::Reader.segment(), self.tag(key), "/")
    }

    /// What every shared hold's key starts with, up to its lock's name (with the opening
    /// of the hash tag in the cluster layout).
    pub(crate) fn readers_head(&self) -> String {
        let head = format!("{}{}", self.prefix, Kind::Reader.segment());
        if self.cluster { head + "{" } else { head }
    }

    /// The prefix of the keys of semaphore `name`'s slots.
    pub(crate) fn slots_of(&self, name: &str) -> String {
        self.named(Kind::Semaphore.segment(), name, "/")
    }

    /// What a single master names the data that `key`, a key of the cluster layout, names,
    /// for a read of the holds that compares what each master carries (`LockNode::held`):
    /// the lock's name without its hash tag's braces. Names never hold a brace, so this is
    /// exact for every key named after its lock's name. The keys a single master names
    /// otherwise (an Idempotency-Key's record, a session's slot) stay as they are: a read
    /// that cannot match them across the two layouts counts each as carried by fewer
    /// masters than it is, which only ever makes a quarantine wait longer.
    pub(crate) fn untagged(&self, key: &str) -> String {
        let Some(rest) = key.strip_prefix(&self.prefix) else {
            return key.to_owned();
        };
        let Some(open) = rest.find('{') else {
            return key.to_owned();
        };
        let Some(close) = rest[open..].find('}').map(|at| open + at) else {
            return key.to_owned();
        };
        format!(
            "{}{}{}{}",
            self.prefix,
            &rest[..open],
            &rest[open + 1..close],
            &rest[close + 1..]
        )
    }

    /// An Idempotency-Key's record, kept beside the name it was used for.
    pub(crate) fn idem(&self, key: &LockKey, record: &str) -> String {
        if self.cluster {
            self.named("idem:", self.tag(key), record)
        } else {
            format!("{}idem:{record}", self.prefix)
        }
    }

    /// A key (or channel) a single master has one of, `master`, and a cluster one per slot:
    /// `<prefix><word>{<the slot's tag>}`, in the slot of `key`.
    fn one_per_slot<'a>(&'a self, key: &LockKey, master: &'a str, word: &str) -> Cow<'a, str> {
        if self.cluster {
            Cow::Owned(self.in_slot(word, self.slot(key)))
        } else {
            Cow::Borrowed(master)
        }
    }

    /// `<prefix><word>{<tag>}`: the name of `word` in hash slot `slot`.
    fn in_slot(&self, word: &str, slot: u16) -> String {
        format!("{}{word}{{{}}}", self.prefix, slot_tag(slot))
    }

    /// The fencing counter a grant of `key` takes its token from.
    pub(crate) fn fence(&self, key: &LockKey) -> Cow<'_, str> {
        self.one_per_slot(key, &self.fence, "fence")
    }

    /// The marker whose absence says that `key`'s data may be lost.
    pub(crate) fn marker(&self, key: &LockKey) -> Cow<'_, str> {
        self.one_per_slot(key, &self.marker, "marker")
    }

    /// A single master's marker (its whole keyspace's).
    pub(crate) fn master_marker(&self) -> &str {
        &self.marker
    }

    /// Where a single master names the data layout it keeps, beside its marker (as
    /// `prelude.lua` reads it: `<marker>:layout`).
    pub(crate) fn master_layout(&self) -> String {
        format!("{}:layout", self.marker)
    }

    /// The run id of the master process under which a single master's marker was written
    /// or its data last verified, beside its marker (`<marker>:run`, as `restore.lua` and
    /// `verified.lua` write it).
    pub(crate) fn master_run(&self) -> String {
        format!("{}:run", self.marker)
    }

    /// A single master's fencing counter.
    pub(crate) fn master_fence(&self) -> &str {
        &self.fence
    }

    /// The fencing counter of a cluster's hash slot.
    pub(crate) fn fence_at(&self, slot: u16) -> String {
        self.in_slot("fence", slot)
    }

    /// The marker of a cluster's hash slot.
    pub(crate) fn marker_at(&self, slot: u16) -> String {
        self.in_slot("marker", slot)
    }

    pub(crate) fn watermarks(&self) -> &str {
        &self.watermarks
    }

    /// A single master's records of how far its clock stands from each replica's.
    pub(crate) fn clocks(&self) -> &str {
        &self.clocks
    }

    /// The index of `kind`'s held names, and the prefix its names' keys are found under;
    /// `None` in the cluster layout, which keeps no index.
    pub(crate) fn index(&self, kind: Kind) -> Option<(&str, &str)> {
        if self.cluster {
            return None;
        }
        self.indexes
            .iter()
            .find(|(word, _, _)| *word == kind.index())
            .map(|(_, index, segment)| (index.as_str(), segment.as_str()))
    }

    /// What the grant scripts are given as the index (KEYS) and the prefix its pruning reads
    /// (ARGV): in the cluster layout, the step's own first key, untouched, and ''.
    pub(crate) fn index_args<'a>(&'a self, kind: Kind, first: &'a str) -> (&'a str, &'a str) {
        self.index(kind).unwrap_or((first, ""))
    }

    /// The pattern of `kind`'s lock keys whose names start with `prefix`, for a scan
    /// (cluster layout), and how long the part before the name is.
    pub(crate) fn scan_pattern(&self, kind: Kind, prefix: &str) -> (String, usize) {
        let head = format!("{}{}{{", self.prefix, kind.segment());
        let mut pattern = head.clone();
        for c in prefix.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push('*');
        (pattern, head.len())
    }

    /// The release channel (a bare name per released lock) that `key`'s release goes to.
    pub(crate) fn channel(&self, key: &LockKey) -> Cow<'_, str> {
        self.one_per_slot(key, &self.channel, "released")
    }

    /// The events channel `key`'s announcements go to.
    pub(crate) fn events(&self, key: &LockKey) -> Cow<'_, str> {
        self.one_per_slot(key, &self.events, "events")
    }

    /// A single master's two channels.
    pub(crate) fn master_channels(&self) -> (&str, &str) {
        (&self.channel, &self.events)
    }

    /// The release channel of a cluster's hash slot (a shard channel).
    pub(crate) fn channel_at(&self, slot: u16) -> String {
        self.in_slot("released", slot)
    }

    /// The events channel of a cluster's hash slot (a shard channel).
    pub(crate) fn events_at(&self, slot: u16) -> String {
        self.in_slot("events", slot)
    }

    /// A session's record. In the cluster layout this is its home, in the slot of its id;
    /// each slot its holds live in has a record of its own (`session_in`).
    pub(crate) fn session(&self, id: &str) -> String {
        self.named("session:", id, "")
    }

    /// The record of session `id` in a cluster's hash `slot`, beside its holds there.
    pub(crate) fn session_in(&self, id: &str, slot: u16) -> String {
        format!("{}session:{{{}}}{id}", self.prefix, slot_tag(slot))
    }

    /// What a session's hash records of `hold` (see session.lua): what it is, then the keys
    /// that carry it.
    pub(crate) fn session_entry(&self, hold: &SessionHold) -> (String, Vec<String>) {
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
}

/// The kind whose lock a key's shared holders and claims belong to: a shared hold's is its
/// mutex's.
fn lock_kind(kind: Kind) -> Kind {
    match kind {
        Kind::Reader => Kind::Mutex,
        kind => kind,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_scripts_name_the_layout_this_release_knows() {
        let layout = include_str!("scripts/layout.lua");
        assert!(
            layout.contains(&format!("local LAYOUT = '{}'", super::LAYOUT)),
            "layout.lua and layout.rs disagree on the layout"
        );
    }

    use super::*;

    #[test]
    fn slots_follow_redis_cluster() {
        // Values from `CLUSTER KEYSLOT` on redis-server 7.0.
        assert_eq!(slot_of("a"), 15495);
        assert_eq!(slot_of("b"), 3300);
        assert_eq!(slot_of("x{b}y"), 3300);
        assert_eq!(slot_of("x{}b"), slot_of("x{}b"));
        assert_ne!(slot_of("x{}b"), slot_of("b"));
    }

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        for slot in 0..SLOTS {
            assert_eq!(slot_of(slot_tag(slot)), slot);
        }
    }

    #[test]
    fn every_key_of_a_step_shares_a_slot_in_the_cluster_layout() {
        let keys = Keys::new("redlockd:", true);
        let lock = LockKey::mutex("nightly");
        let slot = keys.slot(&lock);
        for key in [
            keys.lock(&lock),
            keys.shared(&lock),
            keys.claim(&lock),
            keys.fence(&lock).into_owned(),
            keys.marker(&lock).into_owned(),
            keys.idem(&lock, "abc"),
            keys.channel(&lock).into_owned(),
            keys.events(&lock).into_owned(),
            format!("{}lease", keys.readers_of(&lock)),
        ] {
            assert_eq!(slot_of(&key), slot, "{key}");
        }
        let permit = LockKey {
            kind: Kind::Semaphore,
            name: "pool/3".into(),
        };
        assert_eq!(keys.lock(&permit), format!("{}3", keys.slots_of("pool")));
        assert_eq!(keys.slot(&permit), slot_of("pool"));
    }

    #[test]
    fn a_clusters_key_untagged_is_a_single_masters_for_the_same_name() {
        let (single, cluster) = (Keys::new("redlockd:", false), Keys::new("redlockd:", true));
        for key in [
            LockKey::mutex("a.b-c"),
            LockKey {
                kind: Kind::Semaphore,
                name: "pool/3".into(),
            },
        ] {
            assert_eq!(cluster.untagged(&cluster.lock(&key)), single.lock(&key));
            assert_eq!(cluster.untagged(&cluster.claim(&key)), single.claim(&key));
        }
        assert_eq!(cluster.untagged("other:{a}"), "other:{a}");
        assert_eq!(cluster.untagged("redlockd:lock:a"), "redlockd:lock:a");
    }

    #[test]
    fn a_single_master_keeps_the_layout_every_version_wrote() {
        let keys = Keys::new("redlockd:", false);
        let lock = LockKey::mutex("a");
        assert_eq!(keys.lock(&lock), "redlockd:lock:a");
        assert_eq!(keys.shared(&lock), "redlockd:shared:lock:a");
        assert_eq!(keys.claim(&lock), "redlockd:claim:lock:a");
        assert_eq!(keys.fence(&lock), "redlockd:fence");
        assert_eq!(keys.marker(&lock), "redlockd:marker");
        assert_eq!(keys.readers_of(&lock), "redlockd:reader:a/");
        assert_eq!(keys.idem(&lock, "h"), "redlockd:idem:h");
    }
}
