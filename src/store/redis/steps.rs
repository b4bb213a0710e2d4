//! One builder per script of a lock's life: the keys and arguments of each step, in the
//! order its header lists them (`scripts/<name>.lua`). The tests below hold every builder
//! to its script's header and to the arity its guard accepts, without Redis.

use super::*;

/// acquire.lua, or share.lua for a shared hold: a grant's attempt at `claim.key`.
pub(super) fn acquire(keys: &Keys, claim: &Claim<'_>) -> Step {
    let key = claim.key;
    let lock = keys.lock(key);
    let (index, pruning) = keys.index_args(key.kind, &lock);
    let mut step;
    if key.kind == Kind::Reader {
        step = Step::new("share");
        step.key(&lock)
            .key(&*keys.fence(key))
            .key(&*keys.marker(key))
            .key(index)
            .key(keys.lock(&LockKey::mutex(key.owner_name())))
            .key(keys.shared(key))
            .key(keys.claim(key));
    } else {
        step = Step::new("acquire");
        step.key(&lock)
            .key(&*keys.fence(key))
            .key(&*keys.marker(key))
            .key(index)
            .key(keys.shared(key))
            .key(keys.claim(key));
    }
    step.arg(claim.lease.as_str())
        .arg(claim.ttl_ms)
        .arg(claim.owner.map_or("", Owner::as_str))
        .arg(&*key.name)
        .arg(pruning)
        .arg(claim.listeners.flags())
        .arg(keys.readers_of(key))
        .arg(claim.listeners.patience_ms);
    if key.kind != Kind::Reader {
        step.arg(claim.lock_delay_ms);
    }
    if let Some(idem) = claim.idem {
        step.key(keys.idem(key, &idem.record))
            .arg(&idem.fingerprint)
            .arg(&idem.attempt);
    }
    step
}

/// confirm.lua: a grant decided on a majority, confirmed where it was won.
pub(super) fn confirm(keys: &Keys, key: &LockKey, lease: &LeaseId, token: FencingToken) -> Step {
    let mut step = Step::new("confirm");
    step.key(keys.lock(key))
        .key(&*keys.fence(key))
        .key(&*keys.marker(key))
        .arg(lease.as_str())
        .arg(token.get());
    step
}

/// renew.lua.
pub(super) fn renew(keys: &Keys, renewal: &Renewal<'_>) -> Step {
    let mut step = Step::new("renew");
    step.key(keys.lock(renewal.key))
        .key(&*keys.marker(renewal.key))
        .key(keys.claim(renewal.key));
    if renewal.key.kind == Kind::Reader {
        step.key(keys.shared(renewal.key));
    }
    step.arg(renewal.lease.as_str());
    match renewal.ttl_ms {
        Some(ttl) => step.arg(ttl),
        None => step.arg(""),
    };
    step.arg(renewal.stream.unwrap_or(""));
    if let Some(owner) = renewal.owner {
        step.arg(owner.as_str());
    }
    step
}

/// release.lua: a revoke, an eviction or the undo of a failed attempt.
pub(super) fn release(keys: &Keys, key: &LockKey, lease: &LeaseId, ending: &Ending) -> Step {
    let (announce, attempt) = match ending {
        Ending::Revoke | Ending::Leave { .. } => ("1", ""),
        Ending::Evict => ("2", ""),
        Ending::Undo { attempt } => ("0", attempt.as_deref().unwrap_or("")),
    };
    let kept_by = match ending {
        Ending::Leave { stream } => format!("={stream}"),
        _ => String::new(),
    };
    let mut step = Step::new("release");
    step.key(keys.lock(key))
        .key(&*keys.marker(key))
        .key(keys.claim(key));
    if key.kind == Kind::Reader {
        step.key(keys.shared(key));
    }
    step.arg(lease.as_str())
        .arg(&*keys.channel(key))
        .arg(announce)
        .arg(&*keys.events(key))
        .arg(&*key.topic())
        .arg(attempt)
        .arg(kept_by);
    if keys.is_cluster() {
        step.arg("s");
    }
    step
}

/// read.lua: who holds `key` here.
pub(super) fn read(keys: &Keys, key: &LockKey) -> Step {
    let mut step = Step::new("read");
    step.key(keys.lock(key)).key(&*keys.marker(key));
    step
}

/// delay.lua: how long a lock-delay still refuses grants of the free lock `key` here.
pub(super) fn delay(keys: &Keys, key: &LockKey) -> Step {
    let mut step = Step::new("delay");
    step.key(keys.lock(key))
        .key(&*keys.claim(key))
        .key(&*keys.marker(key));
    step
}

/// acquire_many.lua for `names` (all of `claim`'s names, or those of one slot), the
/// counter and marker of `first`'s slot.
pub(super) fn acquire_many(
    keys: &Keys,
    claim: &Claim<'_>,
    names: &[LockKey],
    first: &LockKey,
) -> Step {
    let fence = keys.fence(first);
    let (index, pruning) = keys.index_args(Kind::Mutex, &fence);
    let mut step = Step::new("acquire_many");
    step.key(&*fence).key(&*keys.marker(first)).key(index);
    for member in names {
        step.key(keys.lock(member))
            .key(keys.shared(member))
            .key(keys.claim(member));
    }
    step.arg(claim.lease.as_str())
        .arg(claim.ttl_ms)
        .arg(claim.owner.map_or("", Owner::as_str))
        .arg(claim.listeners.flags())
        .arg(pruning)
        .arg(&*claim.key.name)
        .arg(claimant_of(claim.lease.as_str()))
        .arg(keys.readers_head())
        .arg(claim.listeners.patience_ms);
    for member in names {
        step.arg(&*member.name);
    }
    if let Some(idem) = claim.idem {
        step.key(keys.idem(first, &idem.record))
            .arg(&idem.fingerprint)
            .arg(&idem.attempt);
    }
    step
}

/// members.lua: a several-name lease's names, through one of them.
pub(super) fn members(keys: &Keys, key: &LockKey, lease: &LeaseId) -> Step {
    let mut step = Step::new("members");
    step.key(keys.lock(key))
        .key(&*keys.marker(key))
        .arg(lease.as_str());
    step
}

/// slots.lua: the permits of semaphore `name` below `limit` held here.
pub(super) fn slots(keys: &Keys, name: &str, limit: u16) -> Step {
    let mut step = Step::new("slots");
    step.key(&*keys.marker(&LockKey {
        kind: Kind::Semaphore,
        name: name.into(),
    }))
    .arg(keys.slots_of(name))
    .arg(limit);
    step
}

/// list.lua: one page of the names of `listing`'s kind from `index`, whose lock keys start
/// with `segment`; at most `budget` names looked at.
pub(super) fn list(
    keys: &Keys,
    index: &str,
    segment: &str,
    listing: &Listing<'_>,
    budget: usize,
) -> Step {
    let mut step = Step::new("list");
    step.key(index)
        .key(keys.master_marker())
        .arg(segment)
        .arg(listing.after)
        .arg(listing.prefix)
        .arg(listing.limit)
        .arg(budget);
    step
}

/// restore.lua: raise the counter at `fence_key` to `fence` and mark the master (or a
/// cluster's slot) at `marker_key` with `identity`; with `run_id`, record it beside the
/// marker.
pub(crate) fn restore(
    fence_key: &str,
    marker_key: &str,
    fence: u64,
    identity: &str,
    run_id: Option<&str>,
) -> Step {
    let mut step = Step::new("restore");
    step.key(fence_key).key(marker_key).arg(fence).arg(identity);
    if let Some(run_id) = run_id {
        step.arg(run_id);
    }
    step
}

/// verified.lua: record `run_id` beside the marker at `marker_key` if it still carries
/// `identity` (the master kept every write it acknowledged through its restart).
pub(crate) fn verified(marker_key: &str, identity: &str, run_id: &str) -> Step {
    let mut step = Step::new("verified");
    step.key(marker_key).arg(identity).arg(run_id);
    step
}

/// unmark.lua: remove the marker at `marker_key` if it still carries `identity`.
pub(crate) fn unmark(marker_key: &str, identity: &str) -> Step {
    let mut step = Step::new("unmark");
    step.key(marker_key).arg(identity);
    step
}

/// watermark.lua: record the highest counter seen on each other master, by identity.
pub(super) fn watermarks(keys: &Keys, seen: &[(String, u64)]) -> Step {
    let mut step = Step::new("watermark");
    step.key(keys.watermarks()).key(keys.master_marker());
    for (identity, fence) in seen {
        step.arg(identity).arg(*fence);
    }
    step
}

/// clocks.lua: record how far this master's clock stands from replica `id`'s.
pub(super) fn clock(keys: &Keys, id: &str, offset_us: i64) -> Step {
    let mut step = Step::new("clocks");
    step.key(keys.clocks()).arg(id).arg(offset_us);
    step
}

/// One operation of session.lua, as its header lists them.
#[derive(Debug, Clone, Copy)]
pub(super) enum SessionOp<'a> {
    Open {
        ttl_ms: u64,
        owner: Option<&'a str>,
    },
    /// `None`: the session's own TTL; with `stream`, a resume's claim.
    Renew {
        ttl_ms: Option<u64>,
        stream: Option<&'a str>,
    },
    Read,
    /// With `stream`, only while that held stream keeps the session.
    End {
        stream: Option<&'a str>,
    },
    /// The hold `lease`, described by `entry`, whose keys here are `keys`; on a cluster's
    /// slot record, made first from `create` (the home's state) when missing.
    Attach {
        lease: &'a str,
        entry: &'a str,
        keys: &'a [String],
        create: Option<&'a SessionState>,
    },
    /// A cluster's home record lists a slot its holds live in.
    Note(u16),
}

/// session.lua: one operation on the session record `record` (a single master's, or one
/// of a cluster's), whose master or slot is marked at `marker`.
pub(super) fn session(record: &str, marker: &str, op: SessionOp<'_>) -> Step {
    let mut step = Step::new("session");
    step.key(record).key(marker);
    match op {
        SessionOp::Open { ttl_ms, owner } => {
            step.arg("open").arg(ttl_ms).arg(owner.unwrap_or(""));
        }
        SessionOp::Renew { ttl_ms, stream } => {
            step.arg("renew");
            match ttl_ms {
                Some(ttl) => step.arg(ttl),
                None => step.arg(""),
            };
            if let Some(stream) = stream {
                step.arg(stream);
            }
        }
        SessionOp::Read => {
            step.arg("read");
        }
        SessionOp::End { stream } => {
            step.arg("end");
            if let Some(stream) = stream {
                step.arg(stream);
            }
        }
        SessionOp::Attach {
            lease,
            entry,
            keys,
            create,
        } => {
            for key in keys {
                step.key(key);
            }
            step.arg("attach").arg(lease).arg(entry);
            if let Some(home) = create {
                step.arg(home.pttl_ms)
                    .arg(home.ttl_ms)
                    .arg(home.owner.as_deref().unwrap_or(""));
            }
        }
        SessionOp::Note(slot) => {
            step.arg("note").arg(slot);
        }
    }
    step
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Idem, Listeners, LockName};
    use std::collections::BTreeSet;

    /// The script's text.
    fn script(name: &str) -> &'static str {
        match name {
            "acquire" => include_str!("../scripts/acquire.lua"),
            "share" => include_str!("../scripts/share.lua"),
            "confirm" => include_str!("../scripts/confirm.lua"),
            "renew" => include_str!("../scripts/renew.lua"),
            "release" => include_str!("../scripts/release.lua"),
            "read" => include_str!("../scripts/read.lua"),
            "delay" => include_str!("../scripts/delay.lua"),
            "members" => include_str!("../scripts/members.lua"),
            "slots" => include_str!("../scripts/slots.lua"),
            "acquire_many" => include_str!("../scripts/acquire_many.lua"),
            "list" => include_str!("../scripts/list.lua"),
            "restore" => include_str!("../scripts/restore.lua"),
            "unmark" => include_str!("../scripts/unmark.lua"),
            "verified" => include_str!("../scripts/verified.lua"),
            "watermark" => include_str!("../scripts/watermark.lua"),
            "clocks" => include_str!("../scripts/clocks.lua"),
            other => panic!("no script {other}"),
        }
    }

    /// The `KEYS[n]` and `ARGV[n]` positions the header (the comments before the code)
    /// describes; an `ARGV    pairs of ...` line describes every argument position.
    fn header(text: &str) -> (BTreeSet<usize>, BTreeSet<usize>) {
        let mut keys = BTreeSet::new();
        let mut args = BTreeSet::new();
        for line in text.lines().take_while(|l| l.starts_with("--")) {
            if line.starts_with("-- ARGV    pairs") {
                args.extend(1..=64);
            }
            for (set, tag) in [(&mut keys, "KEYS["), (&mut args, "ARGV[")] {
                for (at, _) in line.match_indices(tag) {
                    let digits: String = line[at + tag.len()..]
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect();
                    if let Ok(n) = digits.parse() {
                        set.insert(n);
                    }
                }
            }
        }
        (keys, args)
    }

    /// The counts the script's guard names for `#KEYS` and `#ARGV` (the first lines that
    /// compare them with a number): what it accepts.
    fn guard(text: &str, of: &str) -> BTreeSet<usize> {
        let mut counts = BTreeSet::new();
        for line in text.lines().filter(|l| !l.starts_with("--")).take(6) {
            for op in [" == ", " ~= "] {
                let tag = format!("{of}{op}");
                for (at, _) in line.match_indices(&tag) {
                    let digits: String = line[at + tag.len()..]
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect();
                    if let Ok(n) = digits.parse() {
                        counts.insert(n);
                    }
                }
            }
        }
        counts
    }

    /// `step` against its script: every key and argument position is one the header
    /// describes, and the counts are ones the guard accepts.
    fn holds_to_its_script(step: &Step, case: &str) {
        let text = script(step.name());
        let (keys, args) = step.counts();
        let (documented_keys, documented_args) = header(text);
        for (count, documented, what) in [
            (keys, &documented_keys, "KEYS"),
            (args, &documented_args, "ARGV"),
        ] {
            let missing: Vec<usize> = (1..=count).filter(|n| !documented.contains(n)).collect();
            assert!(
                missing.is_empty(),
                "{case}: {}.lua's header does not describe {what} {missing:?}",
                step.name()
            );
        }
        let (accepted_keys, mut accepted_args) = (guard(text, "#KEYS"), guard(text, "#ARGV"));
        // `#ARGV % 2 ~= 0` refuses an odd count: pairs.
        if text.contains("#ARGV % 2 ~= 0") && args % 2 == 0 {
            accepted_args.insert(args);
        }
        assert!(
            accepted_keys.contains(&keys) && accepted_args.contains(&args),
            "{case}: {} keys and {args} arguments; {}.lua accepts {accepted_keys:?} and {accepted_args:?}",
            keys,
            step.name()
        );
    }

    #[test]
    fn every_builder_sends_what_its_script_describes_and_accepts() {
        for cluster in [false, true] {
            let keys = Keys::new("redlockd:", cluster);
            let lock = LockKey::mutex("a");
            let election = LockName::election("e").expect("name").key();
            let slot = LockKey::slot("s", 2);
            let id = crate::model::LeaseId::generate().shared();
            let reader = LockKey::reader("a", &id);
            let idem = Idem {
                record: "r".into(),
                fingerprint: "f".into(),
                attempt: "n".into(),
            };
            let lease = LeaseId::stored("L");
            for key in [&lock, &election, &slot, &reader] {
                let case = format!("{key} (cluster: {cluster})");
                let mut claim = Claim::new(key, &lease, 1000);
                claim.listeners = Listeners::default();
                holds_to_its_script(&acquire(&keys, &claim), &case);
                claim.idem = Some(&idem);
                holds_to_its_script(&acquire(&keys, &claim), &format!("{case}, keyed"));
                holds_to_its_script(&confirm(&keys, key, &lease, FencingToken::new(7)), &case);
                let o = Owner::stored("o");
                let cases = [(None, None, None), (Some(500), Some(&o), Some("s"))];
                for (ttl_ms, owner, stream) in cases {
                    let renewal = Renewal {
                        key,
                        lease: &lease,
                        ttl_ms,
                        owner,
                        stream,
                    };
                    holds_to_its_script(&renew(&keys, &renewal), &case);
                }
                for ending in [
                    Ending::Revoke,
                    Ending::Evict,
                    Ending::Undo {
                        attempt: Some("n".into()),
                    },
                    Ending::Leave { stream: "".into() },
                ] {
                    holds_to_its_script(&release(&keys, key, &lease, &ending), &case);
                }
                holds_to_its_script(&read(&keys, key), &case);
                holds_to_its_script(&delay(&keys, key), &case);
                holds_to_its_script(&members(&keys, key, &LeaseId::stored("L_m")), &case);
            }
            holds_to_its_script(&slots(&keys, "s", 3), "slots");
        }
    }

    /// The argument counts session.lua's header lists for each operation (the lines after
    /// `ARGV[1] the operation:`), by its word: `--   'open' ttl owner      make the
    /// session` is 3 for `open`.
    fn session_operations(text: &str) -> std::collections::BTreeMap<String, BTreeSet<usize>> {
        let mut operations = std::collections::BTreeMap::<String, BTreeSet<usize>>::new();
        let listed = text
            .lines()
            .take_while(|l| l.starts_with("--"))
            .skip_while(|l| !l.contains("ARGV[1] the operation"))
            .take_while(|l| l.trim() != "--");
        for line in listed {
            let Some(rest) = line.trim_start_matches('-').trim_start().strip_prefix('\'') else {
                continue;
            };
            let Some((word, rest)) = rest.split_once('\'') else {
                continue;
            };
            let listed = rest.split("  ").next().unwrap_or_default();
            let count = 1 + listed.split_whitespace().count();
            operations.entry(word.to_owned()).or_default().insert(count);
        }
        operations
    }

    #[test]
    fn every_session_operation_sends_what_its_script_lists() {
        let operations = session_operations(include_str!("../scripts/session.lua"));
        assert_eq!(
            operations.keys().map(String::as_str).collect::<Vec<_>>(),
            ["attach", "end", "note", "open", "read", "renew"],
            "the header lists the operations"
        );
        let home = SessionState {
            ttl_ms: 30_000,
            pttl_ms: 29_000,
            ..SessionState::default()
        };
        let keys = [
            "redlockd:lock:{a}".to_owned(),
            "redlockd:claim:{a}".to_owned(),
        ];
        let cases = [
            SessionOp::Open {
                ttl_ms: 30_000,
                owner: Some("w"),
            },
            SessionOp::Open {
                ttl_ms: 30_000,
                owner: None,
            },
            SessionOp::Renew {
                ttl_ms: None,
                stream: None,
            },
            SessionOp::Renew {
                ttl_ms: Some(5000),
                stream: None,
            },
            SessionOp::Renew {
                ttl_ms: None,
                stream: Some("/s"),
            },
            SessionOp::Read,
            SessionOp::End { stream: None },
            SessionOp::End { stream: Some("") },
            SessionOp::Note(7),
            SessionOp::Attach {
                lease: "L",
                entry: "lock 3 a\nk redlockd:lock:{a}",
                keys: &keys,
                create: None,
            },
            SessionOp::Attach {
                lease: "L",
                entry: "lock 3 a\nk redlockd:lock:{a}",
                keys: &keys,
                create: Some(&home),
            },
        ];
        for op in cases {
            let step = session("redlockd:session:Zm9v", "redlockd:marker", op);
            let (key_count, arg_count) = step.counts();
            let word = step.arg_text(0).expect("the operation's word");
            let listed = operations
                .get(&word)
                .expect("an operation the header lists");
            assert!(
                listed.contains(&arg_count),
                "{op:?}: {arg_count} arguments; the header lists {listed:?} for '{word}'"
            );
            let attached = match op {
                SessionOp::Attach { keys, .. } => keys.len(),
                _ => 0,
            };
            assert_eq!(
                key_count,
                2 + attached,
                "{op:?}: the record, the marker, its keys"
            );
        }
    }

    #[test]
    fn every_upkeep_builder_sends_what_its_script_describes_and_accepts() {
        let keys = Keys::new("redlockd:", false);
        let (index, segment) = keys.index(Kind::Mutex).expect("a single master's index");
        let listing = Listing {
            kind: Kind::Mutex,
            prefix: "inv",
            after: "inv:41",
            limit: 100,
        };
        holds_to_its_script(&list(&keys, index, segment, &listing, 400), "list");
        let (fence, marker) = (keys.master_fence(), keys.master_marker());
        holds_to_its_script(&restore(fence, marker, 1042, "k2V9c0xq", None), "restore");
        holds_to_its_script(
            &restore(fence, marker, 1042, "k2V9c0xq", Some("5f0ce1")),
            "restore with its run",
        );
        holds_to_its_script(&unmark(marker, "k2V9c0xq"), "unmark");
        holds_to_its_script(&verified(marker, "k2V9c0xq", "5f0ce1"), "verified");
        let cluster = Keys::new("redlockd:", true);
        let (fence, marker) = (cluster.fence_at(7), cluster.marker_at(7));
        holds_to_its_script(
            &restore(&fence, &marker, 1042, "k2V9c0xq", None),
            "restore a slot",
        );
        holds_to_its_script(&unmark(&marker, "k2V9c0xq"), "unmark a slot");
        for seen in [1, 3] {
            let seen: Vec<(String, u64)> = (0..seen).map(|i| (format!("m{i}"), 977)).collect();
            holds_to_its_script(&watermarks(&keys, &seen), "watermark");
        }
        holds_to_its_script(&clock(&keys, "5f3a9c", -1520), "clocks");
    }

    #[test]
    fn the_check_sees_a_position_the_header_does_not_describe() {
        let keys = Keys::new("redlockd:", false);
        let mut step = read(&keys, &LockKey::mutex("a"));
        step.arg("one too many");
        let result = std::panic::catch_unwind(|| holds_to_its_script(&step, "read + 1"));
        assert!(result.is_err(), "an undescribed ARGV[1] went unseen");
    }

    #[test]
    fn a_several_name_grant_sends_the_arity_its_guard_computes() {
        // acquire_many.lua: 3 keys, then 3 per name (and the key's record); 9 arguments,
        // then one per name (and the key's fingerprint and nonce).
        let text = script("acquire_many");
        assert!(text.contains("local n = math.floor((#KEYS - 3) / 3)"));
        assert!(text.contains("#ARGV ~= 9 + n + (keyed and 2 or 0)"));
        let idem = Idem {
            record: "r".into(),
            fingerprint: "f".into(),
            attempt: "n".into(),
        };
        for cluster in [false, true] {
            let keys = Keys::new("redlockd:", cluster);
            let names: Vec<LockKey> = ["a", "b", "c"].into_iter().map(LockKey::mutex).collect();
            let group = LockKey::group(&["a", "b", "c"].map(|n| LockName::parse(n).expect("name")));
            for n in 1..=names.len() {
                let lease = LeaseId::stored("L_m");
                let mut claim = Claim::new(&group, &lease, 1000);
                let step = acquire_many(&keys, &claim, &names[..n], &names[0]);
                assert_eq!(step.counts(), (3 + 3 * n, 9 + n), "{n} names");
                claim.idem = Some(&idem);
                let step = acquire_many(&keys, &claim, &names[..n], &names[0]);
                assert_eq!(
                    step.counts(),
                    (3 + 3 * n + 1, 9 + n + 2),
                    "{n} names, keyed"
                );
            }
        }
    }
}
