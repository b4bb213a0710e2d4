//! `redlockd inspect NAME` and `redlockd list [PREFIX]`: the common looks an operator takes,
//! as a readable table (or the server's JSON with `--json`), without curl.

use std::fmt::Write as _;
use std::time::Duration;

use super::lock::exit;
use super::{Failure, Servers, lock_path};
use crate::cli::{InspectArgs, ListArgs};
use crate::model::FencingToken;
use crate::wire::{Leader, LockList, LockStatus, SemaphoreStatus};

/// Page size of `list`: the contract's largest.
const PAGE: u64 = 1000;

fn fail(verb: &str, e: &Failure) -> u8 {
    eprintln!("redlockd {verb}: {e}");
    match e {
        Failure::Invalid(_) | Failure::Denied(_) => exit::USAGE,
        _ => exit::UNAVAILABLE,
    }
}

pub(crate) async fn inspect(args: InspectArgs) -> u8 {
    let servers = match Servers::of(&args.server) {
        Ok(s) => s,
        Err(e) => return fail("inspect", &e),
    };
    let path = if args.semaphore {
        format!("/semaphores/{}", args.name)
    } else if args.election {
        format!("/elections/{}", args.name)
    } else {
        lock_path(&args.name)
    };
    let body: serde_json::Value = match servers.get(&path).await {
        Ok(body) => body,
        Err(e) => return fail("inspect", &e),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&body).unwrap_or_default()
        );
        return 0;
    }
    let shown = if args.semaphore {
        serde_json::from_value(body).map(|s: SemaphoreStatus| permits(&s))
    } else if args.election {
        serde_json::from_value(body).map(|l: Leader| leader(&l))
    } else {
        serde_json::from_value(body).map(|l: LockStatus| holders(&l))
    };
    match shown {
        Ok(text) if text.ends_with(" is free\n") && !args.semaphore && !args.election => {
            print!("{}", free_lock(&servers, &args.name).await);
            0
        }
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => fail(
            "inspect",
            &Failure::Invalid(format!("unexpected answer: {e}")),
        ),
    }
}

/// A free lock, and whether the semaphore or the election of the same name (apart from the
/// lock, and easily meant instead) is held: an operator who asked about `db-pool` while its
/// permits were held was told only that it was free. Either look failing (a token scoped
/// to locks, say) just leaves it out.
async fn free_lock(servers: &Servers, name: &str) -> String {
    let mut others = Vec::new();
    if let Ok(semaphore) = servers
        .get::<SemaphoreStatus>(&format!("/semaphores/{name}"))
        .await
        && !semaphore.holders.is_empty()
    {
        others.push(format!(
            "its semaphore has {} permit{} held (redlockd inspect --semaphore {name})",
            semaphore.holders.len(),
            if semaphore.holders.len() == 1 {
                ""
            } else {
                "s"
            }
        ));
    }
    if let Ok(election) = servers.get::<Leader>(&format!("/elections/{name}")).await
        && !election.vacant
    {
        others.push(format!(
            "its election has a leader (redlockd inspect --election {name})"
        ));
    }
    if others.is_empty() {
        format!("{name} is free\n")
    } else {
        format!("{name} is free as a lock; {}\n", others.join("; "))
    }
}

/// A lock's holders: its one exclusive holder, or each of its shared holders.
fn holders(status: &LockStatus) -> String {
    if !status.held {
        return match status.lock_delay_remaining_ms {
            Some(left) => format!(
                "{} is free, but a lock-delay refuses grants of it for {} more\n",
                status.name,
                seconds(left)
            ),
            None => format!("{} is free\n", status.name),
        };
    }
    let row = |mode: &str, token: FencingToken, left: u64, owner: Option<&str>| {
        vec![
            status.name.clone(),
            mode.to_owned(),
            token.to_string(),
            seconds(left),
            owner.unwrap_or_default().to_owned(),
        ]
    };
    let rows: Vec<Vec<String>> = match &status.holders {
        Some(shared) => shared
            .iter()
            .map(|h| {
                row(
                    "shared",
                    h.fencing_token,
                    h.ttl_remaining_ms,
                    h.owner.as_deref(),
                )
            })
            .collect(),
        None => vec![row(
            "exclusive",
            status.fencing_token.unwrap_or_default(),
            status.ttl_remaining_ms.unwrap_or_default(),
            status.owner.as_deref(),
        )],
    };
    table(&["NAME", "MODE", "TOKEN", "EXPIRES IN", "OWNER"], &rows)
}

/// A semaphore's permits, by slot.
fn permits(status: &SemaphoreStatus) -> String {
    if status.holders.is_empty() {
        return format!("{}: no permit held\n", status.name);
    }
    let rows: Vec<Vec<String>> = status
        .holders
        .iter()
        .map(|h| {
            vec![
                status.name.clone(),
                h.slot.to_string(),
                h.fencing_token.to_string(),
                seconds(h.ttl_remaining_ms),
                h.owner.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table(&["NAME", "SLOT", "TOKEN", "EXPIRES IN", "OWNER"], &rows)
}

/// An election's leader.
fn leader(leader: &Leader) -> String {
    if leader.vacant {
        return format!("{} has no leader\n", leader.name);
    }
    let row = vec![
        leader.name.clone(),
        leader.term.unwrap_or_default().to_string(),
        seconds(leader.ttl_remaining_ms.unwrap_or_default()),
        leader.value.clone().unwrap_or_default(),
    ];
    table(&["NAME", "TERM", "EXPIRES IN", "VALUE"], &[row])
}

pub(crate) async fn list(args: ListArgs) -> u8 {
    let servers = match Servers::of(&args.server) {
        Ok(s) => s,
        Err(e) => return fail("list", &e),
    };
    let mut locks = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        query.append_pair("prefix", &args.prefix);
        query.append_pair("limit", &PAGE.to_string());
        if let Some(after) = &after {
            query.append_pair("after", after);
        }
        let page: LockList = match servers.get(&format!("/locks?{}", query.finish())).await {
            Ok(page) => page,
            Err(e) => return fail("list", &e),
        };
        locks.extend(page.locks);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    if args.json {
        let all = LockList { locks, next: None };
        println!("{}", serde_json::to_string_pretty(&all).unwrap_or_default());
        return 0;
    }
    if locks.is_empty() {
        println!(
            "no lock held exclusively{} (shared locks, semaphores and elections are not \
             listed: redlockd inspect NAME, --semaphore NAME, --election NAME)",
            if args.prefix.is_empty() {
                String::new()
            } else {
                format!(" under {:?}", args.prefix)
            }
        );
        return 0;
    }
    let rows: Vec<Vec<String>> = locks
        .into_iter()
        .map(|l| {
            vec![
                l.name,
                l.fencing_token.to_string(),
                seconds(l.ttl_remaining_ms),
                l.owner.unwrap_or_default(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["NAME", "TOKEN", "EXPIRES IN", "OWNER"], &rows)
    );
    0
}

fn seconds(ms: u64) -> String {
    format!("{:.1}s", Duration::from_millis(ms).as_secs_f64())
}

/// Left-aligned columns under `header`, two spaces apart; the last column unpadded.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let header: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    let mut widths: Vec<usize> = header.iter().map(String::len).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, &w)) in row.iter().zip(&widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_shown_as_it_is_held() {
        let shared: LockStatus = serde_json::from_value(serde_json::json!({
            "name": "queue", "held": true, "mode": "shared", "fencing_token": 9,
            "ttl_remaining_ms": 4000, "holders": [
                {"fencing_token": 8, "ttl_remaining_ms": 3000, "owner": "r-1"},
                {"fencing_token": 9, "ttl_remaining_ms": 4000}
            ]
        }))
        .expect("a lock status");
        assert_eq!(
            holders(&shared),
            "NAME   MODE    TOKEN  EXPIRES IN  OWNER\n\
             queue  shared  8      3.0s        r-1\n\
             queue  shared  9      4.0s\n"
        );
        let free: LockStatus =
            serde_json::from_value(serde_json::json!({"name": "queue", "held": false}))
                .expect("a lock status");
        assert_eq!(holders(&free), "queue is free\n");
        let pool: SemaphoreStatus = serde_json::from_value(serde_json::json!({
            "name": "db-pool", "holders": [
                {"slot": 0, "fencing_token": 41, "ttl_remaining_ms": 17250, "owner": "w-1"},
                {"slot": 2, "fencing_token": 44, "ttl_remaining_ms": 900}
            ]
        }))
        .expect("a semaphore status");
        assert_eq!(
            permits(&pool),
            "NAME     SLOT  TOKEN  EXPIRES IN  OWNER\n\
             db-pool  0     41     17.2s       w-1\n\
             db-pool  2     44     0.9s\n"
        );
        let empty = SemaphoreStatus {
            name: "db-pool".into(),
            holders: vec![],
        };
        assert_eq!(permits(&empty), "db-pool: no permit held\n");
        let led: Leader = serde_json::from_value(serde_json::json!({
            "name": "queue-worker", "vacant": false, "term": 43, "value": "10.0.0.7:9000",
            "ttl_remaining_ms": 7210
        }))
        .expect("a leader");
        assert_eq!(
            leader(&led),
            "NAME          TERM  EXPIRES IN  VALUE\n\
             queue-worker  43    7.2s        10.0.0.7:9000\n"
        );
        let vacant: Leader =
            serde_json::from_value(serde_json::json!({"name": "queue-worker", "vacant": true}))
                .expect("a leader");
        assert_eq!(leader(&vacant), "queue-worker has no leader\n");
    }

    #[test]
    fn the_table_aligns_its_columns() {
        let rows = vec![
            vec!["invoice:42".into(), "7".into(), "2.9s".into(), "w-1".into()],
            vec!["a".into(), "1234".into(), "10.0s".into(), String::new()],
        ];
        assert_eq!(
            table(&["NAME", "TOKEN", "EXPIRES IN", "OWNER"], &rows),
            "NAME        TOKEN  EXPIRES IN  OWNER\n\
             invoice:42  7      2.9s        w-1\n\
             a           1234   10.0s\n"
        );
    }
}
