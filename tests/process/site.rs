//! The documentation site as a reader follows it: every page of `docs/` is in its table of
//! contents and every entry is a page; every link between pages (and from README.md into
//! them) reaches a file, and every `#anchor` a heading of that page, as mdBook names it.
//! External links cannot be reached here and are not followed. A replica serves the built
//! site at `/book/` when `REDLOCKD_BOOK_DIR` names it.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// mdBook's id for a heading: its text lowercased, whitespace made `-`, anything but
/// letters, digits, `-` and `_` dropped (markup first: code, emphasis, link targets).
fn slug(heading: &str) -> String {
    let text = strip_links(heading).replace(['`', '*'], "");
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// `[text](target)` → `text`.
fn strip_links(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after.find("](").and_then(|close| {
            after[close + 2..]
                .find(')')
                .map(|end| (close, close + 2 + end + 1))
        }) {
            Some((close, end)) => {
                out.push_str(&after[..close]);
                rest = &after[end..];
            }
            None => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The ids mdBook gives the headings of `text` (a repeated heading gets `-1`, `-2`, …).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let id = slug(&line[hashes..]);
        let n = seen.entry(id.clone()).or_default();
        ids.insert(if *n == 0 {
            id.clone()
        } else {
            format!("{id}-{n}")
        });
        *n += 1;
    }
    ids
}

/// Every `](target)` of the prose of `text`, without code spans.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        // Code spans are not links.
        let line: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect();
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

fn pages(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            pages(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// What is wrong with the links of the page at `file`; `within` is the folder its links
/// must stay in (the site's, so that the built site has them too).
fn broken(file: &Path, within: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut wrong = Vec::new();
    for link in links(&text) {
        if link.contains("://") || link.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
        let target = if path.is_empty() {
            file.to_path_buf()
        } else {
            file.parent().unwrap().join(path)
        };
        let Ok(target) = target.canonicalize() else {
            wrong.push(format!("{}: {link}: no such file", file.display()));
            continue;
        };
        if !target.starts_with(within) {
            wrong.push(format!(
                "{}: {link}: outside {} (the built site would not have it)",
                file.display(),
                within.display()
            ));
            continue;
        }
        if !anchor.is_empty() {
            let ids = anchors(&std::fs::read_to_string(&target).unwrap_or_default());
            if !ids.contains(anchor) {
                wrong.push(format!(
                    "{}: {link}: no heading with id {anchor:?} in {}",
                    file.display(),
                    target.display()
                ));
            }
        }
    }
    wrong
}

#[test]
fn every_page_is_in_the_contents_and_every_internal_link_and_anchor_resolves() {
    let docs = Path::new(ROOT).join("docs").canonicalize().unwrap();
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> = links(&summary)
        .iter()
        .map(|l| docs.join(l).canonicalize().unwrap_or_else(|_| docs.join(l)))
        .collect();
    let mut all = Vec::new();
    pages(&docs, &mut all);
    let mut wrong = Vec::new();
    for page in &all {
        let page = page.canonicalize().unwrap();
        if page.file_name().is_some_and(|n| n == "SUMMARY.md") {
            continue;
        }
        if !listed.contains(&page) {
            wrong.push(format!("{}: not in SUMMARY.md", page.display()));
        }
        wrong.extend(broken(&page, &docs));
    }
    for entry in &listed {
        if !entry.exists() {
            wrong.push(format!("SUMMARY.md: {} does not exist", entry.display()));
        }
    }
    // README points into the site, and to files of the repository.
    let root = Path::new(ROOT).canonicalize().unwrap();
    wrong.extend(broken(&root.join("README.md"), &root));
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_checker_finds_a_broken_link_and_a_missing_anchor() {
    // The check above could pass by finding nothing; it finds these.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(
        root.join("a.md"),
        "# A page\n\n## The `GET /locks` route, in full\n\n[ok](b.md#a-heading) \
         [self](#the-get-locks-route-in-full) [gone](c.md) [no anchor](b.md#nowhere) \
         `[code](span.md)`\n\n```sh\n[fenced](nowhere.md)\n```\n",
    )
    .unwrap();
    std::fs::write(root.join("b.md"), "# B\n\n## A heading\n").unwrap();
    let wrong = broken(&root.join("a.md"), &root);
    assert_eq!(wrong.len(), 2, "{wrong:#?}");
    assert!(wrong[0].contains("c.md: no such file"), "{wrong:#?}");
    assert!(
        wrong[1].contains("no heading with id \"nowhere\""),
        "{wrong:#?}"
    );
    assert_eq!(
        slug(" Semaphores: at most N holders"),
        "semaphores-at-most-n-holders"
    );
}

/// A built site (here a two-page stand-in: the test must not need mdbook) is served at
/// `/book/`, its pages and their assets by path; without `REDLOCKD_BOOK_DIR` the route
/// answers 404 saying how to get the site.
#[tokio::test]
async fn a_replica_serves_the_built_site_at_book() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("runbooks")).unwrap();
    std::fs::write(dir.path().join("index.html"), "<h1>redlockd</h1>").unwrap();
    std::fs::write(
        dir.path().join("runbooks/redlockdmasterdown.html"),
        "<h1>RedlockdMasterDown</h1>",
    )
    .unwrap();
    let server =
        common::Server::start(&[("REDLOCKD_BOOK_DIR", dir.path().to_str().unwrap())]).await;
    server.wait_ready("the server to be ready").await;
    for (path, expected) in [
        ("/book/", "<h1>redlockd</h1>"),
        ("/book", "<h1>redlockd</h1>"),
        (
            "/book/runbooks/redlockdmasterdown.html",
            "<h1>RedlockdMasterDown</h1>",
        ),
    ] {
        let resp = server.get(path).await;
        assert_eq!(resp.status(), 200, "{path}");
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html"),
            "{path}"
        );
        assert_eq!(resp.text().await.unwrap(), expected, "{path}");
    }
    for path in [
        "/book/nothing.html",
        "/book/../Cargo.toml",
        "/book/%2e%2e/Cargo.toml",
    ] {
        let resp = server.get(path).await;
        assert_eq!(resp.status(), 404, "{path}");
    }

    let bare = common::Server::start(&[]).await;
    bare.wait_ready("the server to be ready").await;
    let resp = common::within(Duration::from_secs(5), bare.get("/book/"), "an answer").await;
    assert_eq!(resp.status(), 404);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "not_found");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("REDLOCKD_BOOK_DIR"),
        "{body}"
    );
}

/// One cell of a Markdown table: no line breaks, no bare `|`.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The command line and its variables as the binary defines them (clap), as Markdown:
/// one section per command, one row per option. Hidden options (test-only switches) are
/// left out.
fn reference() -> String {
    let cli = <redlockd::cli::Cli as clap::CommandFactory>::command();
    let mut out = String::from(
        "# Command line and variables (reference)\n\n\
         Generated from the binary's own definitions (`tests/process/site.rs` fails when this \
         page and the binary differ; `REDLOCKD_UPDATE_REFERENCE=1 cargo test --test process \
         reference` rewrites it). Every option of `serve` is also the environment variable \
         named beside it; [Configuration](configuration.md) explains them.\n",
    );
    fn section(out: &mut String, path: &str, cmd: &clap::Command) {
        if cmd.is_hide_set() || cmd.get_name() == "help" {
            return;
        }
        out.push_str(&format!("\n## `{path}`\n\n"));
        if let Some(about) = cmd.get_about() {
            out.push_str(&format!("{}\n", cell(&about.to_string())));
        }
        let args: Vec<&clap::Arg> = cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set() && !matches!(a.get_id().as_str(), "help" | "version"))
            .collect();
        if !args.is_empty() {
            out.push_str("\n| option | variable | default | meaning |\n|---|---|---|---|\n");
            for arg in args {
                let option = match (arg.get_long(), arg.get_short()) {
                    (Some(long), _) => format!("`--{long}`"),
                    (None, Some(short)) => format!("`-{short}`"),
                    (None, None) => format!("`{}`", arg.get_id().as_str().to_uppercase()),
                };
                let variable = arg
                    .get_env()
                    .map(|e| format!("`{}`", e.to_string_lossy()))
                    .unwrap_or_default();
                let default: Vec<String> = arg
                    .get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect();
                let default = if default.is_empty() {
                    String::new()
                } else {
                    format!("`{}`", default.join(","))
                };
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                out.push_str(&format!(
                    "| {option} | {variable} | {default} | {} |\n",
                    cell(&help)
                ));
            }
        }
        for sub in cmd.get_subcommands() {
            section(out, &format!("{path} {}", sub.get_name()), sub);
        }
    }
    for sub in cli.get_subcommands() {
        section(&mut out, &format!("redlockd {}", sub.get_name()), sub);
    }
    out
}

/// Every variable the binary reads, hidden ones included.
fn variables() -> BTreeSet<String> {
    fn walk(cmd: &clap::Command, out: &mut BTreeSet<String>) {
        for arg in cmd.get_arguments() {
            if let Some(env) = arg.get_env() {
                out.insert(env.to_string_lossy().into_owned());
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(
        &<redlockd::cli::Cli as clap::CommandFactory>::command(),
        &mut out,
    );
    out
}

#[test]
fn the_reference_page_is_the_binarys_command_line() {
    let path = Path::new(ROOT).join("docs/reference.md");
    let generated = reference();
    if std::env::var_os("REDLOCKD_UPDATE_REFERENCE").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/reference.md differs from the binary's command line: run \
         REDLOCKD_UPDATE_REFERENCE=1 cargo test --test process reference, and commit it"
    );
    assert!(generated.contains("`REDLOCKD_CA_FILE`") && generated.contains("## `redlockd lock`"));
}

#[test]
fn the_docs_name_no_variable_the_binary_lacks() {
    // Variables the docs name on purpose that are not the binary's settings: what `lock`
    // gives its command, and the test and benchmark scripts' own.
    let theirs = [
        "REDLOCKD_TEST_NO_INSTALL",
        "REDLOCKD_REQUIRE_REDIS",
        "REDLOCKD_UPDATE_REFERENCE",
        "REDLOCKD_BENCH_ONLY",
        "REDLOCKD_BENCH_SMOKE",
        "REDLOCKD_BENCH_SCALE_ROWS",
        "REDLOCKD_FAULT_SEEDS",
        "REDLOCKD_BIN",
        "REDLOCKD_LEASE_ID",
        "REDLOCKD_FENCING_TOKEN",
        "REDLOCKD_LOCK_NAME",
        "REDLOCKD_VALIDITY_MS",
        "REDLOCKD_TOOLS_DIR",
        "REDLOCKD_FAULT_SEED",
        "REDLOCKD_BENCH_AB",
        "REDLOCKD_BENCH_AB_BIN",
        "REDLOCKD_BENCH_AB_CLIENTS",
        "REDLOCKD_BENCH_TOKEN",
        "REDLOCKD_BENCH_BARE",
        "REDLOCKD_SLOT",
    ];
    let known = variables();
    let mut docs = Vec::new();
    pages(&Path::new(ROOT).join("docs"), &mut docs);
    docs.push(Path::new(ROOT).join("README.md"));
    let mut wrong = BTreeSet::new();
    for page in docs {
        let text = std::fs::read_to_string(&page).unwrap();
        for (at, _) in text.match_indices("REDLOCKD_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            let name = name.trim_end_matches('_').to_owned();
            if !known.contains(&name) && !theirs.contains(&name.as_str()) {
                wrong.insert(format!("{}: {name}", page.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "named in the docs, unknown to the binary:\n{}",
        wrong.iter().cloned().collect::<Vec<_>>().join("\n")
    );
}
