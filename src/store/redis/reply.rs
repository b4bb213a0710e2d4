//! What a script answered, read by position: every script puts its status first (-1: the
//! master lost its marker).

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

/// An acquire script's answer.
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
