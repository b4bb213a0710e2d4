//! A grant's Idempotency-Key, and what it becomes on the masters: the lease id a retry
//! gets again and the record that remembers the first answer, both hashes of the key in
//! its caller's scope, never the key itself.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Idem, InvalidInput, LEASE_ID_BYTES, LeaseId, LockName, b64, millis};

/// An `Idempotency-Key`: 1 to 255 bytes of visible ASCII, chosen by the client for one
/// grant and sent again with each retry of it (a random UUID is the usual choice). It is as
/// secret as the lease it stands for: anyone who sends it again with the same request gets
/// that lease. `Debug` shows no more than a lease id's does.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct IdempotencyKey(String);

/// Longest Idempotency-Key, in bytes.
pub(crate) const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;

impl IdempotencyKey {
    pub(crate) fn parse(raw: &str) -> Result<Self, InvalidInput> {
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
pub(crate) struct GrantKey {
    scope: Arc<str>,
    key: IdempotencyKey,
}

impl GrantKey {
    pub(crate) fn new(scope: impl Into<Arc<str>>, key: IdempotencyKey) -> Self {
        Self {
            scope: scope.into(),
            key,
        }
    }

    /// The lease id a grant of `name` with these parameters gets, and what the masters
    /// record for the key. Both are hashes: the key itself never reaches the masters, and
    /// the lease id depends on the request, so that a key sent again with other parameters
    /// asks for another lease (and meets the record's mismatch) instead of the first one.
    /// `variant` is the rest of the request (a semaphore's limit, a shared grant's mode),
    /// empty for a lock's exclusive grant (whose fingerprint is as it always was).
    pub(crate) fn derive(
        &self,
        name: &LockName,
        variant: &str,
        ttl: Duration,
        owner: Option<&str>,
    ) -> (LeaseId, Idem) {
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
        let mut parts: Vec<&[u8]> = vec![
            kind,
            name.as_str().as_bytes(),
            ttl_ms.as_bytes(),
            owner.unwrap_or(b""),
            if owner.is_some() { b"1" } else { b"0" },
        ];
        if !variant.is_empty() {
            parts.push(variant.as_bytes());
        }
        let fingerprint = hex::encode(&hash(&parts)[..16]);
        let scope = self.scope.as_bytes();
        let key = self.key.0.as_bytes();
        let record = b64(&hash(&[b"record", scope, key])[..18]);
        let lease = hash(&[b"lease", scope, key, fingerprint.as_bytes()]);
        let lease = LeaseId(b64(&lease[..LEASE_ID_BYTES]).into());
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
