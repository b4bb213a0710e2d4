//! The lease domain: the values a client hands us, parsed once at the edge into types
//! that cannot hold an invalid value, and the lease service that grants, renews and
//! revokes leases on top of the Redlock engine.
//!
//! Handlers never pass raw strings or integers around: a `LockName` is always a valid
//! name, a `LeaseId` always looks like one we could have minted, and so on.

mod election;
mod error;
pub mod events;
mod hold;
mod service;

use crate::config::LeaseBounds;
pub use crate::redlock::MasterStatus;
use crate::redlock::node::{Idem, Kind, LockKey};
pub use election::LeaderChange;
pub use error::{LeaseError, MasterFailure, Unavailability};
pub use events::{Events, LockEvent};
pub use hold::{HoldEvent, LostReason};
pub use service::{Lease, LeaseService, LockHolder, Readiness};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use rand::RngCore as _;
use serde::Serialize;

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
pub const MAX_NAME_BYTES: usize = 256;

fn is_name_byte(b: u8) -> bool {
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
    pub fn election(raw: &str) -> Result<Self, InvalidInput> {
        let mut name = Self::parse(raw)
            .map_err(|e| InvalidInput(e.0.replace("lock name", "election name")))?;
        name.kind = Kind::Election;
        Ok(name)
    }

    /// The masters' key of this name.
    pub fn key(&self) -> LockKey {
        LockKey {
            kind: self.kind,
            name: self.name.as_str().into(),
        }
    }

    /// What the event bus and the masters' announcements call it (see `LockKey::topic`).
    pub fn topic(&self) -> std::borrow::Cow<'_, str> {
        match self.kind {
            Kind::Mutex => std::borrow::Cow::Borrowed(&self.name),
            _ => std::borrow::Cow::Owned(self.key().topic().into_owned()),
        }
    }

    pub fn is_election(&self) -> bool {
        self.kind == Kind::Election
    }

    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The metric label for this name: everything up to the first `:` or `.`, so that
    /// `invoice:42` and `invoice:43` count as one class and no raw name becomes a label.
    pub fn class(&self) -> &str {
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
pub struct NamePrefix(String);

impl NamePrefix {
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        if raw.len() > MAX_NAME_BYTES {
            return Err(InvalidInput(format!(
                "prefix must be at most {MAX_NAME_BYTES} bytes"
            )));
        }
        check_alphabet(raw, "prefix")?;
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A lease id: 128 bits from a CSPRNG, base64url without padding.
///
/// Knowing it is what authorises renew and revoke, so it is never logged or shown by
/// inspect; `Debug` prints a short prefix only.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseId(String);

const LEASE_ID_BYTES: usize = 16;
/// Ids we mint are 22 characters; parsing accepts up to 64 so that the format can grow.
pub const MAX_LEASE_ID_LEN: usize = 64;

impl LeaseId {
    pub fn generate() -> Self {
        let mut bytes = [0u8; LEASE_ID_BYTES];
        // ThreadRng is a CSPRNG (ChaCha12) seeded and periodically reseeded from the OS.
        rand::rng().fill_bytes(&mut bytes);
        Self(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
    }

    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        let ok = !raw.is_empty()
            && raw.len() <= MAX_LEASE_ID_LEN
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if ok {
            Ok(Self(raw.to_owned()))
        } else {
            Err(InvalidInput("malformed lease id".into()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.0.chars().take(4).collect();
        write!(f, "LeaseId({shown}…)")
    }
}

/// The fencing token of a grant: strictly greater than every earlier grant of the same
/// name, so the protected resource can refuse a holder whose lease has lapsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct FencingToken(pub u64);

/// Free text naming the holder, shown by inspect and list: at most 256 bytes, no control
/// characters (it ends up in log lines). Shared, not copied, on its way to the masters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Owner(Arc<str>);

/// Longest owner, in bytes.
pub const MAX_OWNER_BYTES: usize = 256;

impl Owner {
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

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text, shared.
    pub fn shared(&self) -> Arc<str> {
        self.0.clone()
    }
}

/// An `Idempotency-Key`: 1 to 255 bytes of visible ASCII, chosen by the client for one
/// grant and sent again with each retry of it (a random UUID is the usual choice). It is as
/// secret as the lease it stands for: anyone who sends it again with the same request gets
/// that lease. `Debug` shows no more than a lease id's does.
#[derive(Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

/// Longest Idempotency-Key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

impl IdempotencyKey {
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        if raw.is_empty() || raw.len() > MAX_IDEMPOTENCY_KEY_BYTES {
            return Err(InvalidInput(format!(
                "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes"
            )));
        }
        if !raw.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(InvalidInput(
                "Idempotency-Key may contain only visible ASCII characters".into(),
            ));
        }
        Ok(Self(raw.to_owned()))
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdempotencyKey(…)")
    }
}

/// A grant's Idempotency-Key in the scope of its caller (the token's name; empty without
/// authentication): two callers' keys never meet.
#[derive(Debug, Clone)]
pub struct GrantKey {
    scope: Arc<str>,
    key: IdempotencyKey,
}

impl GrantKey {
    pub fn new(scope: impl Into<Arc<str>>, key: IdempotencyKey) -> Self {
        Self {
            scope: scope.into(),
            key,
        }
    }

    /// The lease id a grant of `name` with these parameters gets, and what the masters
    /// record for the key. Both are hashes: the key itself never reaches the masters, and
    /// the lease id depends on the request, so that a key sent again with other parameters
    /// asks for another lease (and meets the record's mismatch) instead of the first one.
    fn derive(&self, name: &LockName, ttl: Duration, owner: Option<&str>) -> (LeaseId, Idem) {
        use sha2::{Digest, Sha256};
        let hash = |parts: &[&[u8]]| {
            let mut h = Sha256::new();
            for part in parts {
                // Length-prefixed, so that no two different lists of parts hash alike.
                h.update((part.len() as u64).to_be_bytes());
                h.update(part);
            }
            h.finalize()
        };
        let kind = name.key().kind.segment().as_bytes();
        let ttl_ms = millis(ttl).to_string();
        let owner = owner.map(str::as_bytes);
        let fingerprint = hex::encode(
            &hash(&[
                kind,
                name.as_str().as_bytes(),
                ttl_ms.as_bytes(),
                owner.unwrap_or(b""),
                if owner.is_some() { b"1" } else { b"0" },
            ])[..16],
        );
        let scope = self.scope.as_bytes();
        let key = self.key.0.as_bytes();
        let record = b64(&hash(&[b"record", scope, key])[..18]);
        let lease = hash(&[b"lease", scope, key, fingerprint.as_bytes()]);
        let lease = LeaseId(b64(&lease[..LEASE_ID_BYTES]));
        (
            lease,
            Idem {
                record,
                fingerprint,
                attempt: String::new(),
            },
        )
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

pub use crate::config::MIN_TTL_MS;

/// A lease's TTL, within the configured bounds: only `LeasePolicy` makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttl(Duration);

impl Ttl {
    pub fn get(self) -> Duration {
        self.0
    }
}

/// How long a grant may wait for a held lock, within the configured bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WaitTime(Duration);

impl WaitTime {
    /// Do not wait: answer 409 at once when the lock is held.
    pub const NONE: WaitTime = WaitTime(Duration::ZERO);

    pub fn get(self) -> Duration {
        self.0
    }
}

/// The bounds every lease is held to (from the configuration): the only way a client's
/// `ttl_ms` or `wait_ms` becomes a `Ttl` or a `WaitTime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasePolicy {
    default_ttl: Duration,
    max_ttl: Duration,
    max_wait: Duration,
}

impl From<LeaseBounds> for LeasePolicy {
    fn from(b: LeaseBounds) -> Self {
        Self::new(b.default_ttl, b.max_ttl, b.max_wait)
    }
}

impl LeasePolicy {
    /// The caller (the configuration) has checked `MIN_TTL_MS <= default_ttl <= max_ttl`.
    pub fn new(default_ttl: Duration, max_ttl: Duration, max_wait: Duration) -> Self {
        Self {
            default_ttl,
            max_ttl,
            max_wait,
        }
    }

    /// A grant's TTL: `ttl_ms`, or the default when it names none.
    pub fn ttl(&self, ttl_ms: Option<u64>) -> Result<Ttl, InvalidInput> {
        ttl_ms.map_or(Ok(Ttl(self.default_ttl)), |ms| self.explicit_ttl(ms))
    }

    /// A renew's TTL: `ttl_ms`, or `None` to keep the lease's own.
    pub fn renew_ttl(&self, ttl_ms: Option<u64>) -> Result<Option<Ttl>, InvalidInput> {
        ttl_ms.map(|ms| self.explicit_ttl(ms)).transpose()
    }

    fn explicit_ttl(&self, ms: u64) -> Result<Ttl, InvalidInput> {
        let max = millis(self.max_ttl);
        if (MIN_TTL_MS..=max).contains(&ms) {
            Ok(Ttl(Duration::from_millis(ms)))
        } else {
            Err(InvalidInput(format!(
                "ttl_ms must be from {MIN_TTL_MS} to {max}, got {ms}"
            )))
        }
    }

    /// A grant's wait: `wait_ms`, or none.
    pub fn wait(&self, wait_ms: Option<u64>) -> Result<WaitTime, InvalidInput> {
        let ms = wait_ms.unwrap_or(0);
        let max = millis(self.max_wait);
        if ms <= max {
            Ok(WaitTime(Duration::from_millis(ms)))
        } else {
            Err(InvalidInput(format!(
                "wait_ms must be at most {max}, got {ms}"
            )))
        }
    }

    pub fn max_ttl(&self) -> Duration {
        self.max_ttl
    }

    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }
}

pub use crate::redlock::millis;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_contract_alphabet() {
        assert!(LockName::parse("nightly-report").is_ok());
        assert!(LockName::parse("a.b_c:d~e-F9").is_ok());
        assert!(LockName::parse(&"x".repeat(256)).is_ok());
        assert!(LockName::parse("").is_err());
        assert!(LockName::parse(&"x".repeat(257)).is_err());
        for bad in ["a b", "a/b", "a*", "a?", "é", "a[1]", "a\\b", "a%20"] {
            assert!(LockName::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn class_is_the_name_up_to_the_first_separator() {
        let class = |n: &str| LockName::parse(n).unwrap().class().to_owned();
        assert_eq!(class("invoice:42"), "invoice");
        assert_eq!(class("mail.daily:x"), "mail");
        assert_eq!(class("plain"), "plain");
        assert_eq!(class(":leading"), "");
    }

    #[test]
    fn lease_ids_are_long_random_and_url_safe() {
        let a = LeaseId::generate();
        let b = LeaseId::generate();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 22);
        assert!(LeaseId::parse(a.as_str()).is_ok());
        assert!(LeaseId::parse("has space").is_err());
        assert!(LeaseId::parse("").is_err());
        assert!(!format!("{a:?}").contains(a.as_str()));
    }

    #[test]
    fn the_policy_turns_fields_into_bounded_ttls_and_waits() {
        let policy = LeasePolicy::new(
            Duration::from_secs(30),
            Duration::from_secs(3600),
            Duration::from_secs(60),
        );
        assert_eq!(policy.ttl(None).unwrap().get(), Duration::from_secs(30));
        assert_eq!(
            policy.ttl(Some(100)).unwrap().get(),
            Duration::from_millis(100)
        );
        assert!(policy.ttl(Some(99)).is_err());
        assert!(policy.ttl(Some(3_600_001)).is_err());
        assert_eq!(policy.renew_ttl(None).unwrap(), None);
        assert_eq!(policy.wait(None).unwrap(), WaitTime::NONE);
        assert!(policy.wait(Some(60_001)).is_err());
    }

    #[test]
    fn owner_is_bounded_and_printable() {
        assert!(Owner::parse("worker-7 on host a").is_ok());
        assert!(Owner::parse(&"o".repeat(257)).is_err());
        assert!(Owner::parse("line\nbreak").is_err());
    }
}
