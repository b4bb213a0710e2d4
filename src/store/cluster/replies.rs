//! Reading what a cluster's nodes answer: `INFO` fields, `CLUSTER NODES` lines and
//! `CLUSTER SLOTS` entries.

use redis::Value;

/// The value of field `name` (with its colon) in an `INFO` answer, trimmed.
pub(super) fn info_field(info: &str, name: &str) -> String {
    info.lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Whether a node's `INFO replication` shows a promotion: a `second_repl_offset` other
/// than -1 (the offset up to which its old primary's history is its own).
pub(super) fn promoted(info: &str) -> bool {
    info.lines()
        .find_map(|l| l.trim().strip_prefix("second_repl_offset:"))
        .is_some_and(|offset| offset.trim() != "-1")
}

/// `host:port` of a replica's line of `CLUSTER NODES` (`<id> <ip:port@bus> <flags> ...`).
pub(super) fn replica_address(line: &str) -> Option<String> {
    let mut fields = line.split(' ');
    let (_, address, flags) = (fields.next()?, fields.next()?, fields.next()?);
    flags
        .split(',')
        .any(|f| f == "slave" || f == "replica")
        .then(|| address.split(['@', ',']).next().map(str::to_owned))
        .flatten()
}

/// `host:port` of a node as `CLUSTER SLOTS` lists it: `[host, port, id, ...]`.
pub(super) fn node_address(node: &Value) -> Option<String> {
    let Value::Array(parts) = node else {
        return None;
    };
    let host = match parts.first()? {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        _ => return None,
    };
    let Value::Int(port) = parts.get(1)? else {
        return None;
    };
    Some(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::promoted;

    #[test]
    fn a_promotion_shows_as_a_second_replication_offset() {
        let never = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nmaster_replid:5f1c\r\nmaster_replid2:0000000000000000000000000000000000000000\r\nmaster_repl_offset:1204\r\nsecond_repl_offset:-1\r\n";
        let promoted_once = "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:9a2e\r\nmaster_replid2:5f1c\r\nmaster_repl_offset:1310\r\nsecond_repl_offset:1205\r\n";
        assert!(!promoted(never));
        assert!(promoted(promoted_once));
        // A node that does not say is not taken for promoted by this reading (the caller
        // decides what an unanswered question means).
        assert!(!promoted("# Replication\r\nrole:master\r\n"));
    }
}
