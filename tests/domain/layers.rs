//! The layers read top to bottom: http → lease → redlock → store, with wire, config and
//! metrics below them, `model` (the vocabulary) under everything, and app above all. A
//! module that reaches up (or sideways past the layer below it) fails here, naming the
//! file and the reference; so does a module that re-exports another's items (`pub use
//! crate::…`), which would let a layer above name them through it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What each top-level module may name with `crate::` (besides itself).
const ALLOWED: &[(&str, &[&str])] = &[
    (
        "http",
        &[
            "lease",
            "wire",
            "config",
            "metrics",
            "auth",
            "telemetry",
            "model",
        ],
    ),
    ("auth", &[]),
    ("lease", &["redlock", "config", "metrics", "model"]),
    ("redlock", &["store", "metrics", "telemetry", "model"]),
    ("store", &["config", "model"]),
    ("client", &["wire", "config", "cli", "trust", "model"]),
    ("cli", &["config"]),
    ("wire", &["model"]),
    ("config", &["model"]),
    ("metrics", &[]),
    ("logging", &[]),
    ("telemetry", &["trust"]),
    ("trust", &[]),
    ("model", &[]),
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`src/lease/service.rs` → `lease`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component");
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_owned()
}

/// Every `crate::<module>` a file names, as its references to other modules.
fn references(text: &str) -> BTreeSet<String> {
    text.match_indices("crate::")
        .filter(|(at, _)| {
            // `redlockd::crate::` does not occur; skip `$crate::` in macros.
            !text[..*at].ends_with('$')
        })
        .filter_map(|(at, m)| {
            let rest = &text[at + m.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// Every source file under `src/`: its path, its top-level module and its text.
fn modules() -> Vec<(PathBuf, String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files
        .into_iter()
        .map(|file| {
            let module = module_of(&src, &file);
            let text = std::fs::read_to_string(&file).expect("read source");
            (file, module, text)
        })
        .collect()
}

#[test]
fn no_module_reaches_up_or_past_the_layer_below_it() {
    let mut wrong = Vec::new();
    for (file, module, text) in modules() {
        let Some((_, allowed)) = ALLOWED.iter().find(|(m, _)| *m == module) else {
            // lib.rs, main.rs and app.rs wire everything together.
            continue;
        };
        for target in references(&text) {
            if target != module && !allowed.contains(&target.as_str()) {
                wrong.push(format!("{} names crate::{target}", file.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "references against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_module_re_exports_another_modules_items() {
    let mut wrong = Vec::new();
    for (file, module, text) in modules() {
        if matches!(module.as_str(), "lib" | "main" | "app") {
            continue;
        }
        for line in text
            .lines()
            .filter(|l| l.trim_start().starts_with("pub use crate::"))
        {
            wrong.push(format!("{}: {}", file.display(), line.trim()));
        }
    }
    assert!(
        wrong.is_empty(),
        "re-exports of another module's items (name them where they live):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn only_the_engine_reaches_its_nodes() {
    // Layers above the engine ask it (`Redlock::masters`, `traffic`); a node reached
    // through `nodes()` from above is a tunnel this file's other checks cannot see.
    let wrong: Vec<String> = modules()
        .into_iter()
        .filter(|(_, module, _)| !matches!(module.as_str(), "redlock" | "store"))
        .filter(|(_, _, text)| text.contains(".nodes()"))
        .map(|(file, _, _)| file.display().to_string())
        .collect();
    assert!(
        wrong.is_empty(),
        "nodes reached from above the engine:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_checker_sees_a_reference_up() {
    let refs = references("use crate::http::AppState;\nlet x = $crate::foo;");
    assert_eq!(refs, BTreeSet::from(["http".to_owned()]));
}
