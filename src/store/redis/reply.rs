//! What each script answers, read in one place: a function per script, named for what it
//! answers (`acquired`, `renewed`, ...), reading the reply its header's `Returns` line
//! documents. Every script puts its status first (-1: the master lost its marker). Unit
//! tests below hold each to its header's example answers, without Redis.

use super::*;

/// Reads the loosely typed replies of our scripts.
pub(super) struct Reply(pub(super) Vec<Value>);

impl Reply {
    pub(super) fn of(value: Value) -> NodeResult<Self> {
        match value {
            Value::Array(items) => Ok(Self(items)),
            Value::Int(i) => Ok(Self(vec![Value::Int(i)])),
            other => Err(NodeError::Script(format!("unexpected reply {other:?}"))),
        }
    }

    pub(super) fn int(&self, i: usize) -> NodeResult<i64> {
        match self.0.get(i) {
            Some(Value::Int(v)) => Ok(*v),
            other => Err(NodeError::Script(format!(
                "expected an integer at {i}, got {other:?}"
            ))),
        }
    }

    /// A count or token: a negative one means the data on the master is corrupt, which is
    /// an error, never a silent 0.
    pub(super) fn uint(&self, i: usize) -> NodeResult<u64> {
        let v = self.int(i)?;
        u64::try_from(v).map_err(|_| {
            NodeError::Script(format!("expected a non-negative integer at {i}, got {v}"))
        })
    }

    pub(super) fn string(&self, i: usize) -> NodeResult<String> {
        match self.0.get(i) {
            Some(Value::BulkString(bytes)) => Ok(String::from_utf8_lossy(bytes).into_owned()),
            Some(Value::SimpleString(s)) => Ok(s.clone()),
            other => Err(NodeError::Script(format!(
                "expected a string at {i}, got {other:?}"
            ))),
        }
    }

    pub(super) fn owner(&self, i: usize) -> NodeResult<Option<Owner>> {
        Ok(Some(self.string(i)?)
            .filter(|o| !o.is_empty())
            .map(Owner::stored))
    }

    /// A holding as read.lua, list.lua and slots.lua write it from `at`: lease, token, TTL,
    /// what is left of it, owner.
    pub(super) fn holding(&self, at: usize) -> NodeResult<Holding> {
        Ok(Holding {
            lease: LeaseId::stored(self.string(at)?),
            token: FencingToken::new(self.uint(at + 1)?),
            ttl_ms: self.uint(at + 2)?,
            pttl_ms: self.uint(at + 3)?,
            owner: self.owner(at + 4)?,
            stream: None,
        })
    }

    /// The status every script puts first: -1 means the master lost its marker.
    pub(super) fn status(&self) -> NodeResult<i64> {
        match self.int(0)? {
            -1 => Err(NodeError::Amnesic),
            s => Ok(s),
        }
    }
}

/// confirm.lua's answer: 1, or -1 (the marker is missing).
pub(super) fn confirmed(reply: &Reply) -> NodeResult<()> {
    reply.status().map(drop)
}

/// renew.lua's answer for `lease`: {1, token, ttl_ms, pttl_ms, owner, stream} when
/// renewed, {0} when the lease does not hold the lock here.
pub(super) fn renewed(reply: &Reply, lease: &LeaseId) -> NodeResult<Owned<Holding>> {
    if reply.status()? == 0 {
        return Ok(Owned::NotOwner);
    }
    Ok(Owned::Yes(Holding {
        lease: lease.clone(),
        token: FencingToken::new(reply.uint(1)?),
        ttl_ms: reply.uint(2)?,
        pttl_ms: reply.uint(3)?,
        owner: reply.owner(4)?,
        stream: Some(reply.string(5)?.into()),
    }))
}

/// release.lua's answer: 1 when deleted, 0 when the lease does not hold the lock here.
pub(super) fn released(reply: &Reply) -> NodeResult<Owned<()>> {
    Ok(match reply.status()? {
        1 => Owned::Yes(()),
        _ => Owned::NotOwner,
    })
}

/// read.lua's answer: {1, lease, token, ttl_ms, pttl_ms, owner} when held, {0} when free.
pub(super) fn holders(reply: &Reply) -> NodeResult<Vec<Holding>> {
    if reply.status()? == 0 {
        return Ok(Vec::new());
    }
    Ok(vec![reply.holding(1)?])
}

/// delay.lua's answer: {1, pttl_ms} while a lock-delay runs on the free lock, {0} when not.
pub(super) fn delay_left(reply: &Reply) -> NodeResult<Option<std::time::Duration>> {
    if reply.status()? == 0 {
        return Ok(None);
    }
    Ok(Some(std::time::Duration::from_millis(reply.uint(1)?)))
}

/// members.lua's answer: {1, names} when the lease holds the name here, {0} when not.
pub(super) fn member_names(reply: &Reply) -> NodeResult<Option<String>> {
    if reply.status()? == 0 {
        return Ok(None);
    }
    Ok(Some(reply.string(1)?))
}

/// slots.lua's answer: {1, slot, lease, token, ttl_ms, pttl_ms, owner, slot, ...}.
/// One page of `held.lua`: its next cursor, then a key, its holder and its PTTL each.
pub(crate) fn held_page(reply: Vec<Value>) -> NodeResult<HeldPage> {
    let mut reply = reply.into_iter();
    let text = |v: Value| match v {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
        _ => None,
    };
    let next = reply
        .next()
        .and_then(text)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| NodeError::Script("held: no cursor".into()))?;
    let mut holds = Vec::new();
    while let (Some(key), Some(holder), Some(Value::Int(pttl))) =
        (reply.next(), reply.next(), reply.next())
    {
        let (Some(key), Some(holder)) = (text(key), text(holder)) else {
            return Err(NodeError::Script("held: a malformed row".into()));
        };
        holds.push((key, holder, u64::try_from(pttl).unwrap_or(0)));
    }
    Ok(HeldPage { holds, next })
}

pub(super) fn held_slots(reply: &Reply) -> NodeResult<Vec<(u16, Holding)>> {
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

/// list.lua's answer for a page after `after`: {more, last, name, lease, token, ttl_ms,
/// pttl_ms, owner, name, ...}.
pub(super) fn page(reply: &Reply, after: &str) -> NodeResult<ListPage> {
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

/// acquire.lua's (and share.lua's, acquire_many.lua's) answer: {1, token} granted, {0,
/// pttl_ms, holder} held, {-2} another request's key, {-3} ended, {-4, pttl_ms} delayed.
pub(super) fn acquired(reply: &Reply) -> NodeResult<Acquired> {
    match reply.status()? {
        1 => Ok(Acquired::Granted {
            token: FencingToken::new(reply.uint(1)?),
        }),
        -2 => Ok(Acquired::Mismatch),
        -3 => Ok(Acquired::Ended),
        -4 => Ok(Acquired::Delayed {
            pttl_ms: reply.uint(1)?,
        }),
        _ => Ok(Acquired::Held {
            pttl_ms: reply.uint(1)?,
            lease: LeaseId::stored(reply.string(2)?),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(v: i64) -> Value {
        Value::Int(v)
    }

    fn text(v: &str) -> Value {
        Value::BulkString(v.as_bytes().to_vec())
    }

    fn reply(items: Vec<Value>) -> Reply {
        Reply::of(Value::Array(items)).expect("an array")
    }

    /// The holding `lease`, token 42, TTL 30000, 29000 left, owner `w`, as the scripts
    /// write it.
    fn holding_values(lease: &str) -> Vec<Value> {
        vec![text(lease), int(42), int(30_000), int(29_000), text("w")]
    }

    fn holding(lease: &str) -> Holding {
        Holding {
            lease: LeaseId::stored(lease),
            token: FencingToken::new(42),
            ttl_ms: 30_000,
            pttl_ms: 29_000,
            owner: Some(Owner::stored("w")),
            stream: None,
        }
    }

    #[test]
    fn every_script_that_lost_its_marker_answers_amnesic() {
        let lost = || Reply::of(Value::Array(vec![int(-1)])).expect("an array");
        assert_eq!(acquired(&lost()), Err(NodeError::Amnesic));
        assert_eq!(
            confirmed(&Reply::of(int(-1)).expect("an integer")),
            Err(NodeError::Amnesic)
        );
        assert_eq!(
            renewed(&lost(), &LeaseId::stored("L")),
            Err(NodeError::Amnesic)
        );
        assert_eq!(
            released(&Reply::of(int(-1)).expect("an integer")),
            Err(NodeError::Amnesic)
        );
        assert_eq!(holders(&lost()), Err(NodeError::Amnesic));
        assert_eq!(member_names(&lost()), Err(NodeError::Amnesic));
        assert_eq!(held_slots(&lost()), Err(NodeError::Amnesic));
        assert_eq!(page(&lost(), ""), Err(NodeError::Amnesic));
    }

    #[test]
    fn each_script_is_read_as_its_header_says() {
        // acquire.lua: granted, held, another request's key, ended, delayed.
        assert_eq!(
            acquired(&reply(vec![int(1), int(42)])),
            Ok(Acquired::Granted {
                token: FencingToken::new(42)
            })
        );
        assert_eq!(
            acquired(&reply(vec![int(0), int(900), text("H")])),
            Ok(Acquired::Held {
                pttl_ms: 900,
                lease: LeaseId::stored("H")
            })
        );
        assert_eq!(acquired(&reply(vec![int(-2)])), Ok(Acquired::Mismatch));
        assert_eq!(acquired(&reply(vec![int(-3)])), Ok(Acquired::Ended));
        assert_eq!(
            acquired(&reply(vec![int(-4), int(700)])),
            Ok(Acquired::Delayed { pttl_ms: 700 })
        );
        // confirm.lua and release.lua answer a bare integer.
        assert_eq!(confirmed(&Reply::of(int(1)).expect("an integer")), Ok(()));
        assert_eq!(
            released(&Reply::of(int(1)).expect("an integer")),
            Ok(Owned::Yes(()))
        );
        assert_eq!(
            released(&Reply::of(int(0)).expect("an integer")),
            Ok(Owned::NotOwner)
        );
        // renew.lua: the lease is the caller's; the rest is the master's.
        let mut renewal = vec![int(1)];
        renewal.extend(holding_values("L").into_iter().skip(1));
        renewal.push(text("s1"));
        assert_eq!(
            renewed(&reply(renewal), &LeaseId::stored("L")),
            Ok(Owned::Yes(Holding {
                stream: Some("s1".into()),
                ..holding("L")
            }))
        );
        assert_eq!(
            renewed(&reply(vec![int(0)]), &LeaseId::stored("L")),
            Ok(Owned::NotOwner)
        );
        // read.lua, members.lua.
        let mut read = vec![int(1)];
        read.extend(holding_values("L"));
        assert_eq!(holders(&reply(read)), Ok(vec![holding("L")]));
        assert_eq!(holders(&reply(vec![int(0)])), Ok(vec![]));
        assert_eq!(
            member_names(&reply(vec![int(1), text("a b")])),
            Ok(Some("a b".to_owned()))
        );
        assert_eq!(member_names(&reply(vec![int(0)])), Ok(None));
        // slots.lua: slot, then the holding, for each held slot.
        let mut slots = vec![int(1), int(0)];
        slots.extend(holding_values("P0"));
        slots.push(int(2));
        slots.extend(holding_values("P2"));
        assert_eq!(
            held_slots(&reply(slots)),
            Ok(vec![(0, holding("P0")), (2, holding("P2"))])
        );
        // list.lua: more, last, then name and holding for each lock.
        let mut listed = vec![int(1), text("inv:9"), text("inv:1")];
        listed.extend(holding_values("L"));
        assert_eq!(
            page(&reply(listed), "inv:0"),
            Ok(ListPage {
                locks: vec![("inv:1".to_owned(), holding("L"))],
                more: true,
                last: Some("inv:9".to_owned()),
            })
        );
        let nothing_new = reply(vec![int(0), text("inv:0")]);
        assert_eq!(
            page(&nothing_new, "inv:0"),
            Ok(ListPage::default()),
            "the last name examined is the caller's own: no progress to report"
        );
    }

    #[test]
    fn a_negative_token_is_corrupt_data_never_a_zero() {
        assert!(matches!(
            acquired(&reply(vec![int(1), int(-5)])),
            Err(NodeError::Script(_))
        ));
        let mut read = vec![int(1), text("L"), int(-1)];
        read.extend(holding_values("L").into_iter().skip(2));
        assert!(matches!(holders(&reply(read)), Err(NodeError::Script(_))));
    }
}
