//! Who may lock what: bearer tokens from a file (`REDLOCKD_AUTH_FILE`), each with a name
//! for logs, the SHA-256 of the token (never the token), a role and the name prefixes it
//! may use.
//!
//! The file is JSON:
//!
//! ```json
//! {"tokens": [
//!   {"name": "ci-jobs", "sha256": "<64 hex digits>", "role": "client", "prefixes": ["jobs:", "cron:"]},
//!   {"name": "grafana", "sha256": "<64 hex digits>", "role": "reader", "prefixes": [""]},
//!   {"name": "oncall", "sha256": "<64 hex digits>", "role": "admin"}
//! ]}
//! ```
//!
//! Tokens are 256 random bits (`redlockd token new` makes them), so a plain SHA-256 is
//! enough to keep the file from being a list of passwords: there is nothing to guess.
//! A presented token is hashed and compared with every entry in constant time.

use std::fmt;
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use rand::RngCore as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Grant, renew, revoke and check leases (and campaign, proclaim, resign) within its
    /// prefixes.
    Client,
    /// Inspect and list locks (and read and observe elections) within its prefixes.
    Reader,
    /// Everything, on every name, including force-release.
    Admin,
}

/// What a route needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Hold leases: grant, renew, revoke, check; campaign, proclaim, resign.
    Hold,
    /// Look: inspect, list; leader, observe. Also the operations routes when they are
    /// not open.
    Read,
    /// Force-release.
    Admin,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Client => "client",
            Role::Reader => "reader",
            Role::Admin => "admin",
        })
    }
}

impl Role {
    fn allows(self, need: Need) -> bool {
        matches!(
            (self, need),
            (Role::Admin, _) | (Role::Client, Need::Hold) | (Role::Reader, Need::Read)
        )
    }
}

/// One line of the token file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub name: String,
    pub sha256: String,
    pub role: Role,
    /// Names the token may use start with one of these; `""` is every name. An admin needs
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<TokenEntry>,
}

/// The shapes a token file may have: `{"tokens": [...]}`, or the list alone.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum FileShape {
    Object(TokenFile),
    List(Vec<TokenEntry>),
}

/// What a token file must look like, for messages.
const FILE_SHAPE: &str =
    r#"{"tokens": [{"name", "sha256", "role", "prefixes"}, ...]} (or the list alone)"#;

/// A caller the token file knows: its token's name (for logs), role and prefixes.
#[derive(Debug, Clone)]
pub struct Caller {
    pub name: Arc<str>,
    pub role: Role,
    prefixes: Arc<[String]>,
}

impl Caller {
    /// Whether this caller may do what `need` says.
    pub(crate) fn allows(&self, need: Need) -> bool {
        self.role.allows(need)
    }

    /// Whether `name` is within this caller's prefixes.
    pub(crate) fn covers(&self, name: &str) -> bool {
        self.role == Role::Admin || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
}

struct Known {
    hash: [u8; 32],
    caller: Caller,
}

/// The tokens of one reading of the file.
pub struct Tokens {
    known: Vec<Known>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.known.iter().map(|k| &*k.caller.name).collect();
        f.debug_struct("Tokens").field("names", &names).finish()
    }
}

fn sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Tokens {
    /// Parse the file's text; the error says what is wrong and where, never a hash.
    pub fn parse(text: &str) -> Result<Self, String> {
        let tokens = match serde_json::from_str::<FileShape>(text) {
            Ok(FileShape::Object(file)) => file.tokens,
            Ok(FileShape::List(tokens)) => tokens,
            // Untagged, serde says only that nothing matched: parse again as the object to
            // say what is wrong and where.
            Err(_) => {
                let why = match serde_json::from_str::<TokenFile>(text) {
                    Err(e) => e.to_string(),
                    Ok(_) => "unexpected shape".into(),
                };
                return Err(format!("not a token file ({why}); expected {FILE_SHAPE}"));
            }
        };
        let mut known = Vec::with_capacity(tokens.len());
        for (i, entry) in tokens.into_iter().enumerate() {
            let at = format!("token {} ({:?})", i + 1, entry.name);
            if entry.name.is_empty() || entry.name.chars().any(char::is_control) {
                return Err(format!("{at}: name must be non-empty text"));
            }
            let mut hash = [0u8; 32];
            hex::decode_to_slice(entry.sha256.trim(), &mut hash)
                .map_err(|_| format!("{at}: sha256 must be 64 hex digits"))?;
            if entry.role != Role::Admin && entry.prefixes.is_empty() {
                return Err(format!(
                    "{at}: a {} token needs at least one prefix (\"\" for every name)",
                    entry.role
                ));
            }
            if known
                .iter()
                .any(|k: &Known| k.caller.name.as_ref() == entry.name)
            {
                return Err(format!("{at}: the name is used twice"));
            }
            known.push(Known {
                hash,
                caller: Caller {
                    name: entry.name.into(),
                    role: entry.role,
                    prefixes: entry.prefixes.into(),
                },
            });
        }
        Ok(Self { known })
    }

    pub(crate) fn load(path: &str) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        Self::parse(&text)
    }

    /// The caller a presented token stands for. Every entry is compared, in constant time,
    /// so the answer's timing says nothing about which entry, if any, matched.
    pub fn authenticate(&self, token: &str) -> Option<Caller> {
        let presented = sha256(token);
        let mut found = None;
        for known in &self.known {
            if bool::from(known.hash.ct_eq(&presented)) {
                found = Some(known.caller.clone());
            }
        }
        found
    }

    pub(crate) fn len(&self) -> usize {
        self.known.len()
    }
}

/// Each token's request rate: GCRA from `governor`, keyed by the token's name.
type Limiter = governor::DefaultKeyedRateLimiter<Arc<str>>;

/// The tokens in force, and where they come from: re-read on SIGHUP, keeping the old ones
/// when the new file is malformed.
pub(crate) struct Auth {
    path: String,
    tokens: RwLock<Arc<Tokens>>,
    /// Whether `/metrics`, `/openapi.json` and `/docs` need a reader token.
    pub guard_operations: bool,
    limiter: Option<Limiter>,
}

impl Auth {
    /// `rate` requests per second per token (with bursts of `burst`), or none.
    pub(crate) fn load(
        path: &str,
        guard_operations: bool,
        rate: Option<(std::num::NonZeroU32, std::num::NonZeroU32)>,
    ) -> Result<Self, String> {
        Ok(Self {
            path: path.to_owned(),
            tokens: RwLock::new(Arc::new(Tokens::load(path)?)),
            guard_operations,
            limiter: rate.map(|(per_second, burst)| {
                governor::RateLimiter::keyed(
                    governor::Quota::per_second(per_second).allow_burst(burst),
                )
            }),
        })
    }

    /// `None` when `caller` may make a request now; else how long until it may.
    pub(crate) fn throttle(&self, caller: &Caller) -> Option<std::time::Duration> {
        use governor::clock::Clock as _;
        let limiter = self.limiter.as_ref()?;
        // Keys of tokens removed by a reload are forgotten as the map is pruned.
        if limiter.len() > 4 * self.tokens().len().max(16) {
            limiter.retain_recent();
        }
        limiter.check_key(&caller.name).err().map(|not_until| {
            not_until.wait_time_from(governor::clock::DefaultClock::default().now())
        })
    }

    pub(crate) fn tokens(&self) -> Arc<Tokens> {
        self.tokens
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// When the file last changed (`None` if it cannot be read now).
    pub(crate) fn modified(&self) -> Option<std::time::SystemTime> {
        std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok()
    }

    /// Read the file again. On error the tokens in force stay, and the error says why.
    pub(crate) fn reload(&self) -> Result<usize, String> {
        let fresh = Tokens::load(&self.path)?;
        let count = fresh.len();
        *self.tokens.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
        Ok(count)
    }
}

/// A new token and its file entry: the token is shown once and never stored.
pub fn new_token(name: &str, role: Role, prefixes: Vec<String>) -> (String, TokenEntry) {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let token = format!(
        "rlk_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let entry = TokenEntry {
        name: name.to_owned(),
        sha256: hex::encode(sha256(&token)),
        role,
        prefixes,
    };
    (token, entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(entries: &[TokenEntry]) -> String {
        serde_json::json!({ "tokens": entries }).to_string()
    }

    #[test]
    fn a_new_token_authenticates_as_its_entry_and_nothing_else_does() {
        let (token, entry) = new_token("ci", Role::Client, vec!["jobs:".into()]);
        assert!(token.starts_with("rlk_") && token.len() > 40);
        assert!(!serde_json::to_string(&entry).unwrap().contains(&token));
        let tokens = Tokens::parse(&file(&[entry])).unwrap();
        let caller = tokens.authenticate(&token).expect("known");
        assert_eq!(&*caller.name, "ci");
        assert!(caller.allows(Need::Hold) && !caller.allows(Need::Read));
        assert!(caller.covers("jobs:nightly") && !caller.covers("cron:x"));
        assert!(tokens.authenticate("rlk_wrong").is_none());
        assert!(tokens.authenticate("").is_none());
    }

    fn entry_for(name: &str) -> TokenEntry {
        new_token(name, Role::Admin, vec![]).1
    }

    #[test]
    fn a_file_holding_only_the_list_is_read_as_the_list() {
        let (token, entry) = new_token("ci", Role::Client, vec!["jobs:".into()]);
        let list = serde_json::to_string(&vec![entry]).unwrap();
        let tokens = Tokens::parse(&list).expect("the list alone is a token file");
        assert_eq!(&*tokens.authenticate(&token).expect("known").name, "ci");
    }

    #[test]
    fn roles_are_named_in_lowercase_as_the_file_spells_them() {
        assert_eq!(Role::Client.to_string(), "client");
        let (_, entry) = new_token("ci", Role::Reader, vec![]);
        let err = Tokens::parse(&file(&[entry])).unwrap_err();
        assert!(err.contains("a reader token"), "{err}");
    }

    #[test]
    fn roles_allow_what_the_contract_says() {
        assert!(Role::Reader.allows(Need::Read) && !Role::Reader.allows(Need::Hold));
        assert!(!Role::Client.allows(Need::Admin) && !Role::Reader.allows(Need::Admin));
        assert!(Role::Admin.allows(Need::Hold) && Role::Admin.allows(Need::Admin));
    }

    #[test]
    fn a_malformed_file_is_refused_with_the_reason() {
        let (_, mut entry) = new_token("ci", Role::Client, vec![]);
        assert!(
            Tokens::parse(&file(&[entry.clone()]))
                .unwrap_err()
                .contains("prefix")
        );
        entry.prefixes = vec!["".into()];
        entry.sha256 = "abc".into();
        let err = Tokens::parse(&file(&[entry])).unwrap_err();
        assert!(err.contains("64 hex digits"), "{err}");
        let err = Tokens::parse("{\"tokens\": [{\"nom\": 1}]}").unwrap_err();
        assert!(err.contains("expected {\"tokens\""), "{err}");
        // A lone entry (what `redlockd token new` prints) is not a file; say the shape.
        let err = Tokens::parse(&serde_json::to_string(&entry_for("one")).unwrap()).unwrap_err();
        assert!(err.contains("expected {\"tokens\""), "{err}");
        let (_, a) = new_token("same", Role::Admin, vec![]);
        let (_, b) = new_token("same", Role::Admin, vec![]);
        assert!(Tokens::parse(&file(&[a, b])).unwrap_err().contains("twice"));
    }
}
