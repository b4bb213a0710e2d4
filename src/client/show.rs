//! `redlockd inspect NAME` and `redlockd list [PREFIX]`: the common looks an operator takes,
//! as a readable table (or the server's JSON with `--json`), without curl.

use std::fmt::Write as _;
use std::time::Duration;

use super::lock::exit;
use super::{Failure, Servers, lock_path};
use crate::cli::{InspectArgs, ListArgs};
use crate::wire::{LockList, LockStatus};

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
    let servers = match Servers::new(&args.server.servers, args.server.token.as_deref()) {
        Ok(s) => s,
        Err(e) => return fail("inspect", &e),
    };
    let status: LockStatus = match servers.get(&lock_path(&args.name)).await {
        Ok(status) => status,
        Err(e) => return fail("inspect", &e),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).unwrap_or_default()
        );
        return 0;
    }
    if !status.held {
        println!("{} is free", status.name);
        return 0;
    }
    let row = [
        status.name,
        status
            .fencing_token
            .map(|t| t.to_string())
            .unwrap_or_default(),
        status.ttl_remaining_ms.map(seconds).unwrap_or_default(),
        status.owner.unwrap_or_default(),
    ];
    print!("{}", table(&[row]));
    0
}

pub(crate) async fn list(args: ListArgs) -> u8 {
    let servers = match Servers::new(&args.server.servers, args.server.token.as_deref()) {
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
        println!("no lock held");
        return 0;
    }
    let rows: Vec<[String; 4]> = locks
        .into_iter()
        .map(|l| {
            [
                l.name,
                l.fencing_token.to_string(),
                seconds(l.ttl_remaining_ms),
                l.owner.unwrap_or_default(),
            ]
        })
        .collect();
    print!("{}", table(&rows));
    0
}

fn seconds(ms: u64) -> String {
    format!("{:.1}s", Duration::from_millis(ms).as_secs_f64())
}

/// Left-aligned columns under a header, two spaces apart.
fn table(rows: &[[String; 4]]) -> String {
    let header = ["NAME", "TOKEN", "EXPIRES IN", "OWNER"].map(String::from);
    let mut widths = header.each_ref().map(String::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
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
    fn the_table_aligns_its_columns() {
        let rows = vec![
            ["invoice:42".into(), "7".into(), "2.9s".into(), "w-1".into()],
            ["a".into(), "1234".into(), "10.0s".into(), String::new()],
        ];
        assert_eq!(
            table(&rows),
            "NAME        TOKEN  EXPIRES IN  OWNER\n\
             invoice:42  7      2.9s        w-1\n\
             a           1234   10.0s\n"
        );
    }
}
