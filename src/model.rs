//! The ground floor: the vocabulary every layer names as it is. What a client hands us,
//! parsed once at the edge into types that cannot hold an invalid value (a `LockName` is
//! always a valid name, a `LeaseId` always looks like one we could have minted), the key a
//! lock has on the masters (its kind and name), the fencing token, the record that makes a
//! grant idempotent, and the reports about masters that reach `/readyz` and 503 bodies.
//!
//! It names no other module of the crate: the HTTP edge, the lease service, the engine and
//! the masters all speak it, so that no layer re-exports another's types.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use rand::RngCore as _;
use serde::{Deserialize, Serialize};

/// The smallest TTL the contract accepts, in ms.
pub(crate) const MIN_TTL_MS: u64 = 100;

/// The contract's default bounds of `ttl_ms` and `wait_ms` (REDLOCKD_MAX_TTL_MS and
/// REDLOCKD_MAX_WAIT_MS change them): the OpenAPI document states these.
pub(crate) const DEFAULT_MAX_TTL_MS: u64 = 3_600_000;
pub(crate) const DEFAULT_MAX_WAIT_MS: u64 = 60_000;
/// The largest lock-delay the contract allows, in ms.
pub(crate) const MAX_LOCK_DELAY_MS: u64 = 60_000;

/// Largest `limit` of a list call, and the default.
pub(crate) const MAX_LIST_LIMIT: u64 = 1000;
pub(crate) const DEFAULT_LIST_LIMIT: u64 = 100;

/// A duration in whole milliseconds, as the contract and the masters count them
/// (saturating): the one conversion every layer uses.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Why a value from a client was refused; the message is shown to the client as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidInput(pub String);

/// A lock name: 1 to 256 bytes of `A-Z a-z 0-9 . _ : ~ -` (the contract's alphabet, which
/// is also safe inside a Redis key, a glob pattern and a URL path segment unescaped), and
/// the kind of lock it names: a `/locks/{name}` mutex or an `/elections/{name}` election,
/// which never collide.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName {
    name: String,
    kind: Kind,
}

impl Serialize for LockName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name)
    }
}

/// Longest lock name and longest lock-name prefix, in bytes.
pub(crate) const MAX_NAME_BYTES: usize = 256;

/// Whether `b` may stand in a lock name.
pub(crate) fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'~' | b'-')
}

impl LockName {
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        if raw.is_empty() || raw.len() > MAX_NAME_BYTES {
            return Err(InvalidInput(format!(
                "lock name must be 1 to {MAX_NAME_BYTES} bytes, got {}",
                raw.len()
            )));
        }
        check_alphabet(raw, "lock name")?;
        Ok(Self {
            name: raw.to_owned(),
            kind: Kind::Mutex,
        })
    }

    /// The name of an election (`/elections/{name}`), with the same alphabet.
    pub(crate) fn election(raw: &str) -> Result<Self, InvalidInput> {
        let mut name = Self::parse(raw)
            .map_err(|e| InvalidInput(e.0.replace("lock name", "election name")))?;
        name.kind = Kind::Election;
        Ok(name)
    }

    /// The name of a semaphore (`/semaphores/{name}`), with the same alphabet.
    pub(crate) fn semaphore(raw: &str) -> Result<Self, InvalidInput> {
        let mut name = Self::parse(raw)
            .map_err(|e| InvalidInput(e.0.replace("lock name", "semaphore name")))?;
        name.kind = Kind::Semaphore;
        Ok(name)
    }

    /// The kind of lock it names.
    pub(crate) fn kind(&self) -> Kind {
        self.kind
    }

    /// The masters' key of this name.
    pub fn key(&self) -> LockKey {
        LockKey {
            kind: self.kind,
            name: self.name.as_str().into(),
        }
    }

    /// What the event bus and the masters' announcements call it (see `LockKey::topic`).
    pub(crate) fn topic(&self) -> std::borrow::Cow<'_, str> {
        match self.kind {
            Kind::Mutex => std::borrow::Cow::Borrowed(&self.name),
            _ => std::borrow::Cow::Owned(self.key().topic().into_owned()),
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.name
    }

    /// The metric label for this name: everything up to the first `:` or `.`, so that
    /// `invoice:42` and `invoice:43` count as one class and no raw name becomes a label.
    pub(crate) fn class(&self) -> &str {
        self.name.split([':', '.']).next().unwrap_or(&self.name)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

fn check_alphabet(raw: &str, what: &str) -> Result<(), InvalidInput> {
    match raw.bytes().position(|b| !is_name_byte(b)) {
        None => Ok(()),
        Some(at) => Err(InvalidInput(format!(
            "{what} may contain only A-Z a-z 0-9 . _ : ~ - (bad byte at offset {at})"
        ))),
    }
}

/// A prefix filter for listing locks: like a name, but may be empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NamePrefix(String);

impl NamePrefix {
    pub(crate) fn parse(raw: &str) -> Result<Self, InvalidInput> {
        if raw.len() > MAX_NAME_BYTES {
            return Err(InvalidInput(format!(
                "prefix must be at most {MAX_NAME_BYTES} bytes"
            )));
        }
        check_alphabet(raw, "prefix")?;
        Ok(Self(raw.to_owned()))
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

/// A session id: like a lease id, 128 bits from a CSPRNG, base64url without padding; a
/// capability (whoever knows it renews and ends the session and holds through it), so it
/// is never logged, and `Debug` prints a short prefix only. A session belongs to the token
/// that opened it: on the masters it is named by the id and a hash of the token's name
/// (`key`), so that another token's request with the same id finds no session.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SessionId {
    id: String,
    /// A hash of the opening token's name (empty without authentication).
    scope: String,
}

impl SessionId {
    /// A new session id for the token named `scope` ("" without authentication).
    pub(crate) fn generate(scope: &str) -> Self {
        Self::scoped(LeaseId::generate().0.to_string(), scope)
    }

    /// The session id `raw`, as the token named `scope` asks for it.
    pub(crate) fn parse(raw: &str, scope: &str) -> Result<Self, InvalidInput> {
        LeaseId::parse(raw)
            .map(|id| Self::scoped(id.0.to_string(), scope))
            .map_err(|_| InvalidInput("malformed session id".into()))
    }

    fn scoped(id: String, scope: &str) -> Self {
        let scope = scope_tag(scope);
        Self { id, scope }
    }

    /// The id the client knows.
    pub(crate) fn as_str(&self) -> &str {
        &self.id
    }

    /// The session's name on the masters: its id, within its token's scope.
    pub(crate) fn key(&self) -> String {
        if self.scope.is_empty() {
            self.id.clone()
        } else {
            format!("{}.{}", self.scope, self.id)
        }
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.id.chars().take(4).collect();
        write!(f, "SessionId({shown}…)")
    }
}

/// A lease id: 128 bits from a CSPRNG, base64url without padding.
///
/// Knowing it is what authorises renew and revoke, so it is never logged or shown by
/// inspect; `Debug` prints a short prefix only.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseId(Arc<str>);

const LEASE_ID_BYTES: usize = 16;
/// Ids we mint are 22 characters; parsing accepts up to 64 so that the format can grow.
pub(crate) const MAX_LEASE_ID_LEN: usize = 64;

impl LeaseId {
    pub(crate) fn generate() -> Self {
        let mut bytes = [0u8; LEASE_ID_BYTES];
        // ThreadRng is a CSPRNG (ChaCha12) seeded and periodically reseeded from the OS.
        rand::rng().fill_bytes(&mut bytes);
        Self(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(bytes)
                .into(),
        )
    }

    /// A lease id a caller sent: checked for its form, never for being one we minted.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        let ok = !raw.is_empty()
            && raw.len() <= MAX_LEASE_ID_LEN
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if ok {
            Ok(Self(raw.into()))
        } else {
            Err(InvalidInput("malformed lease id".into()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A lease id as a master stored it: one this service wrote there, so not checked
    /// again.
    pub(crate) fn stored(raw: impl Into<Arc<str>>) -> Self {
        Self(raw.into())
    }

    /// The lease id of permit `slot` of a semaphore, made from a minted (or derived) id.
    pub(crate) fn permit(&self, slot: Slot) -> Self {
        Self(format!("{}_{}_{}", self.base(), slot.index, slot.limit).into())
    }

    /// The lease id of a shared hold, made from a minted (or derived) id: renew, check and
    /// revoke find its key by it.
    pub(crate) fn shared(&self) -> Self {
        Self(format!("{}{SHARED_TAIL}", self.base()).into())
    }

    /// The lease id of a several-name lease, made from a minted (or derived) id.
    pub(crate) fn group(&self) -> Self {
        Self(format!("{}{GROUP_TAIL}", self.base()).into())
    }

    /// Whether the id is a several-name lease's.
    pub(crate) fn is_group(&self) -> bool {
        self.0.get(MINTED_LEN..) == Some(GROUP_TAIL)
    }

    /// An id minted for one attempt of a grant that may make several: its first half is
    /// `claimant`'s (the same for every attempt of the grant, so that the masters know a
    /// grant's claims as its own from one attempt to the next), the rest new random bits.
    pub(crate) fn attempt_of(claimant: &LeaseId) -> Self {
        let fresh = Self::generate();
        // A minted id is MINTED_LEN ASCII characters: the second half is there to take.
        let rest = fresh.0.get(MINTED_LEN / 2..).unwrap_or(&fresh.0);
        Self(format!("{}{rest}", claimant_of(claimant.as_str())).into())
    }

    /// What the masters know the holder named `identity` by (a Dapr `lockOwner`), for the
    /// token named `scope`, on `name`: a hash of the three in a minted id's shape. A grant
    /// made for that holder takes its lease ids from it as an attempt takes its claimant's
    /// (`attempt_of`), so that the holder's lease is told from others' by its first half
    /// (`claimant_of`) while each grant's id is still its own. The identity itself is kept
    /// nowhere: it is a capability, as a lease id is.
    pub(crate) fn of_holder(scope: &str, name: &LockName, identity: &str) -> Self {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for part in [
            b"holder".as_slice(),
            scope.as_bytes(),
            name.as_str().as_bytes(),
        ] {
            // Length-prefixed, so that no two different lists of parts hash alike.
            h.update((part.len() as u64).to_be_bytes());
            h.update(part);
        }
        h.update(identity.as_bytes());
        Self(b64(&h.finalize()[..LEASE_ID_BYTES]).into())
    }

    /// Whether the id is a shared hold's.
    pub(crate) fn is_shared(&self) -> bool {
        self.0.get(MINTED_LEN..) == Some(SHARED_TAIL)
    }

    /// The minted part of the id: a permit's without its slot.
    pub(crate) fn base(&self) -> &str {
        self.0.get(..MINTED_LEN).unwrap_or(&self.0)
    }

    /// The slot a permit's id names, if it names one (see `Slot`).
    pub(crate) fn slot(&self) -> Option<Slot> {
        let tail = self.0.get(MINTED_LEN..)?.strip_prefix('_')?;
        let (index, limit) = tail.split_once('_')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(index) || !digits(limit) {
            return None;
        }
        let (index, limit) = (index.parse().ok()?, limit.parse().ok()?);
        (index < limit && limit <= MAX_PERMITS).then_some(Slot { index, limit })
    }
}

/// What the masters know the claims of the grant whose attempt holds `lease` by: the first
/// half of the id (see `LeaseId::attempt_of`).
pub(crate) fn claimant_of(lease: &str) -> &str {
    lease.get(..MINTED_LEN / 2).unwrap_or(lease)
}

/// What the masters know a token by (its name's scope, `""` without authentication): 16 hex
/// digits of its SHA-256, `""` for `""`. Names no token, and is as long whatever the name.
fn scope_tag(scope: &str) -> String {
    use sha2::{Digest, Sha256};
    if scope.is_empty() {
        String::new()
    } else {
        hex::encode(&Sha256::digest(scope.as_bytes())[..8])
    }
}

/// A new name for a held stream on the masters (renew.lua's 'stream'), opened by the token
/// named `scope`: `<opener>/<random>`, so that a master can refuse a resume by another
/// token (the opener is `""` without authentication, and every resume is then allowed).
pub(crate) fn stream_name(scope: &str) -> Arc<str> {
    format!("{}/{}", scope_tag(scope), LeaseId::generate().as_str()).into()
}

/// The tag of the token that opened the held stream named `stream` (see `stream_name`):
/// `""` for a name without one.
pub(crate) fn opener_of(stream: &str) -> &str {
    stream.split_once('/').map_or("", |(opener, _)| opener)
}

/// The length of the ids we mint (16 bytes in base64url).
const MINTED_LEN: usize = 22;
/// What follows the minted part of a shared hold's id.
const SHARED_TAIL: &str = "_s";
/// What follows the minted part of a several-name lease's id.
const GROUP_TAIL: &str = "_m";

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.0.chars().take(4).collect();
        write!(f, "LeaseId({shown}…)")
    }
}

/// The fencing token of a grant: strictly greater than every earlier grant of the same
/// name, so the protected resource can refuse a holder whose lease has lapsed.
/// Every layer passes it as it is; the masters' scripts count it as an integer, and the
/// contract's bodies write it as one (`0` is below every grant's).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct FencingToken(u64);

impl FencingToken {
    /// The token a master's counter gave (or a body wrote). Made only where a counter is
    /// read; there is no arithmetic on tokens beyond comparing two.
    pub const fn new(counter: u64) -> Self {
        Self(counter)
    }

    /// The counter's value, as the masters' scripts and the contract's bodies count it.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// A token read from a body or a master compares with the counter it was.
impl PartialEq<u64> for FencingToken {
    fn eq(&self, other: &u64) -> bool {
        self.0 == *other
    }
}

impl PartialOrd<u64> for FencingToken {
    fn partial_cmp(&self, other: &u64) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Free text naming the holder, shown by inspect and list: at most 256 bytes, no control
/// characters (it ends up in log lines). Shared, not copied, on its way to the masters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Owner(Arc<str>);

/// Longest owner, in bytes.
pub(crate) const MAX_OWNER_BYTES: usize = 256;

impl Owner {
    /// Owner text a caller sent: checked for its length and characters.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        if raw.len() > MAX_OWNER_BYTES {
            return Err(InvalidInput(format!(
                "owner must be at most {MAX_OWNER_BYTES} bytes"
            )));
        }
        if raw.chars().any(char::is_control) {
            return Err(InvalidInput(
                "owner must not contain control characters".into(),
            ));
        }
        Ok(Self(raw.into()))
    }

    /// Owner text as a master stored it: text this service checked when it wrote it.
    pub(crate) fn stored(raw: impl Into<Arc<str>>) -> Self {
        Self(raw.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Owner text reads as the text it is (in bodies, logs and comparisons).
impl std::ops::Deref for Owner {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The kinds of lock the masters hold. Each kind has a key space of its own on every
/// master, so that no primitive can ever collide with a user's lock of the same name, and
/// a node operation always says which kind it acts on. The mutex (one holder at a time:
/// the contract's locks) is the first; semaphore slots, read/write locks and elections
/// are to get a variant each, with their own segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Kind {
    Mutex,
    /// An election: one leader at a time, whose lease's token is its term and whose owner
    /// text is its value.
    Election,
    /// A semaphore's slots: a permit is one of `limit` slots of the name, each a mutex of
    /// its own (see `LockKey::slot`), so that at most `limit` permits are valid at once
    /// whatever the masters' votes.
    Semaphore,
    /// A shared holder of a lock (`mode: shared`): a key of its own per lease (see
    /// `LockKey::reader`), beside the lock's own key that an exclusive holder takes.
    Reader,
    /// Several locks under one lease (`POST /locks` with `names`): a key that stands for
    /// its members, each a mutex's own key (see `LockKey::group`); every step on it is a
    /// step on each member, and its grant takes all of them or none on each master.
    Group,
}

impl Kind {
    /// Every kind.
    pub(crate) const ALL: [Kind; 5] = [
        Kind::Mutex,
        Kind::Election,
        Kind::Semaphore,
        Kind::Reader,
        Kind::Group,
    ];

    /// This kind's segment of the key space, after the configured prefix. The mutex's is
    /// `lock:`, as every version of redlockd has written it, so that upgrades find the
    /// locks held before them.
    pub(crate) fn segment(self) -> &'static str {
        match self {
            Kind::Mutex => "lock:",
            Kind::Election => "election:",
            Kind::Semaphore => "semaphore:",
            Kind::Reader => "reader:",
            Kind::Group => "lock:",
        }
    }

    /// The contract's collection of this kind: its routes are `/<route>/{name}…`.
    pub(crate) fn route(self) -> &'static str {
        match self {
            Kind::Mutex => "locks",
            Kind::Election => "elections",
            Kind::Semaphore => "semaphores",
            Kind::Reader | Kind::Group => "locks",
        }
    }

    /// The kind as the API and the metrics' `kind` label name it: `lock` (exclusive,
    /// shared or several names), `semaphore` or `election`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Election => "election",
            Kind::Semaphore => "semaphore",
            Kind::Mutex | Kind::Reader | Kind::Group => "lock",
        }
    }

    /// The kind as one word, as a session's record of its holds writes it (session.lua).
    pub(crate) fn word(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::Election => "election",
            Kind::Semaphore => "semaphore",
            Kind::Reader => "reader",
            Kind::Group => "group",
        }
    }

    /// The kind `word` names (see `word`).
    pub(crate) fn from_word(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.word() == word)
    }

    /// The name of this kind's index of held names (for listing), after the prefix.
    pub(crate) fn index(self) -> &'static str {
        match self {
            Kind::Mutex => "names",
            Kind::Election => "elections",
            Kind::Semaphore => "semaphores",
            Kind::Reader => "readers",
            Kind::Group => "names",
        }
    }
}

/// The most names one lease may hold (`POST /locks` with `names`).
pub(crate) const MAX_GROUP_NAMES: usize = 64;

/// How a lock is held: by one exclusive holder (the default), or shared by any number of
/// shared holders.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    #[default]
    Exclusive,
    Shared,
}

/// The largest `limit` of a semaphore.
pub(crate) const MAX_PERMITS: u16 = 1000;

/// How many permits a semaphore grant allows at once: 1 to `MAX_PERMITS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PermitLimit(u16);

impl PermitLimit {
    pub(crate) fn parse(raw: u64) -> Result<Self, InvalidInput> {
        match u16::try_from(raw) {
            Ok(n) if (1..=MAX_PERMITS).contains(&n) => Ok(Self(n)),
            _ => Err(InvalidInput(format!(
                "limit must be from 1 to {MAX_PERMITS}, got {raw}"
            ))),
        }
    }

    pub(crate) fn get(self) -> u16 {
        self.0
    }
}

/// Which permit of a semaphore a lease is: its slot (0 to `limit` - 1) and the limit it was
/// granted with. A permit's lease id carries both after its 128 random bits
/// (`LeaseId::permit`), so that renew, check and revoke go straight to the slot; an id
/// whose tail was altered names a slot its lease does not hold, and is not found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    pub index: u16,
    pub limit: u16,
}

/// What a node operation acts on: a name in one kind's key space.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    pub kind: Kind,
    pub name: Arc<str>,
}

impl LockKey {
    /// A mutex: the lock of the contract's `/locks/{name}`.
    pub fn mutex(name: impl Into<Arc<str>>) -> Self {
        Self {
            kind: Kind::Mutex,
            name: name.into(),
        }
    }

    /// Slot `slot` of the semaphore `name`: its key's name is `<name>/<slot>` (names have
    /// no `/`, so no two semaphores' slots meet), and the masters' index of semaphores
    /// lists a name's slots together, under the prefix `<name>/`.
    pub(crate) fn slot(name: &str, slot: u16) -> Self {
        Self {
            kind: Kind::Semaphore,
            name: format!("{name}/{slot}").into(),
        }
    }

    /// The shared hold of lease `lease` on the lock `name`: its key's name is
    /// `<name>/<lease>` (names have no `/`), listed under the prefix `<name>/` in the
    /// masters' index of readers.
    pub(crate) fn reader(name: &str, lease: &LeaseId) -> Self {
        Self {
            kind: Kind::Reader,
            name: format!("{name}/{}", lease.as_str()).into(),
        }
    }

    /// The locks `names` under one lease: the key's name is the names sorted, separated by
    /// spaces (names have none), so that every grant of the same names asks in the same
    /// order.
    pub(crate) fn group(names: &[LockName]) -> Self {
        let mut sorted: Vec<&str> = names.iter().map(LockName::as_str).collect();
        sorted.sort_unstable();
        sorted.dedup();
        Self {
            kind: Kind::Group,
            name: sorted.join(" ").into(),
        }
    }

    /// The mutexes a group key stands for (a key of another kind stands for itself).
    pub(crate) fn members(&self) -> Vec<LockKey> {
        match self.kind {
            Kind::Group => self.name.split(' ').map(LockKey::mutex).collect(),
            _ => vec![self.clone()],
        }
    }

    /// The lock a shared hold or a semaphore's slot belongs to: the name before its `/`.
    pub(crate) fn owner_name(&self) -> &str {
        self.name.split('/').next().unwrap_or(&self.name)
    }

    /// How announcements and the event bus name this key: a mutex by its bare name (as
    /// every version of redlockd announces it), other kinds by a path no lock name can
    /// spell (names have no `/`), so that an election never wakes a lock's waiters. Every
    /// slot of a semaphore is announced as the semaphore: a freed slot wakes its waiters.
    pub(crate) fn topic(&self) -> std::borrow::Cow<'_, str> {
        match self.kind {
            Kind::Mutex => std::borrow::Cow::Borrowed(&self.name),
            Kind::Election => std::borrow::Cow::Owned(format!("/elections/{}", self.name)),
            Kind::Semaphore => {
                std::borrow::Cow::Owned(format!("/semaphores/{}", self.owner_name()))
            }
            // A shared hold's end wakes the lock's waiters: it is announced as the lock.
            Kind::Reader => std::borrow::Cow::Borrowed(self.owner_name()),
            // Each member is announced as itself (see `members`); this is the first's.
            Kind::Group => {
                std::borrow::Cow::Borrowed(self.name.split(' ').next().unwrap_or(&self.name))
            }
        }
    }
}

impl std::fmt::Display for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// Who wants to hear of a hold's end, so that the masters announce it only then: a grant
/// that waits for the lock marks its holder (the release then wakes waiters in every
/// replica), and an observed hold (held by a stream, or an election's term, which observers
/// follow) announces its grant and its end to observers. A replica's own waiters and
/// observers hear of what it does itself without the masters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Listeners {
    /// The grant will wait if the lock is held.
    pub waiting: bool,
    /// The hold, once granted, is followed by observers.
    pub observed: bool,
    /// The hold is one of a semaphore's slots: its end is always announced, since the
    /// grants that wait for a permit read the slots and mark none of them.
    pub pooled: bool,
    /// How much longer a waiting grant will wait, in ms: a claim it makes on a name
    /// (acquire_many.lua) lasts no longer, so that one that gave up holds nobody up.
    pub patience_ms: u64,
}

impl Listeners {
    /// How acquire.lua reads them: 'w' waiting, 'o' observed, 'a' always announce (pooled).
    pub(crate) fn flags(self) -> &'static str {
        match (self.waiting, self.observed, self.pooled) {
            (false, false, false) => "",
            (true, false, false) => "w",
            (false, true, false) => "o",
            (true, true, false) => "wo",
            (false, false, true) => "a",
            (true, false, true) => "wa",
            (false, true, true) => "oa",
            (true, true, true) => "woa",
        }
    }
}

/// One hold made through a session: the key its lease holds, the lease, its token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionHold {
    pub key: LockKey,
    pub lease: LeaseId,
    pub token: FencingToken,
}

/// How a grant's hold behaves beyond its TTL: who hears of its end, and how long the name
/// stays refused after it ends other than by its holder's revoke (its lock-delay).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrantTerms {
    pub listeners: Listeners,
    /// 0: none.
    pub lock_delay_ms: u64,
}

impl From<Listeners> for GrantTerms {
    fn from(listeners: Listeners) -> Self {
        Self {
            listeners,
            lock_delay_ms: 0,
        }
    }
}

/// What makes a grant idempotent on a master: the record its Idempotency-Key leaves there
/// (named by a hash of the key, never the key itself) and the request it stands for. The
/// lease id of such a grant is derived from both, so that a retry asks for the very lease
/// the first attempt may have won, and acquire answers "granted" with that lease's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idem {
    /// Names the record: a hash of the caller's scope and the key.
    pub record: String,
    /// The request the key was first used for (kind, name, TTL, owner), hashed.
    pub fingerprint: String,
    /// This attempt's nonce, which the engine sets for each attempt of each retry (callers
    /// leave it empty): the hold notes which attempt made it and which last answered for
    /// it, so that undoing a failed attempt never takes away a hold a concurrent attempt of
    /// the same key counts on.
    pub attempt: String,
}

/// What a replica announces through the masters besides releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum News {
    /// A grant was decided on a majority.
    Acquired,
    /// A holder changed its owner text (a leader's value).
    Proclaimed,
}

impl News {
    /// The verb of the events channel's `<verb> <token> <name>`.
    pub(crate) fn verb(self) -> &'static str {
        match self {
            News::Acquired => "acquired",
            News::Proclaimed => "proclaimed",
        }
    }
}

mod backoff;
pub(crate) use backoff::jittered;
mod idempotency;
pub(crate) use idempotency::{GrantKey, IdempotencyKey, MAX_IDEMPOTENCY_KEY_BYTES};
mod jeopardy;
pub(crate) use jeopardy::Jeopardy;
mod reports;
pub(crate) use reports::{
    ClusterStatus, MasterFailure, MasterStatus, ShardStatus, Traffic, Unavailability,
};

#[cfg(test)]
mod tests;
