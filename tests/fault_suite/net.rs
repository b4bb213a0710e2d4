//! The fault suite's network: each scenario runs in a private network namespace of its own
//! (`unshare --net`), so its firewall rules and ports vanish with it and no traffic leaves
//! it. Replica `r` reaches every master at 127.0.0.`r+2` (the suite itself uses 127.0.0.1),
//! which is what lets a rule cut one replica off from one master (or drop only that
//! master's replies to it).

use std::collections::BTreeSet;
use std::process::Command;

/// Set inside the namespace, so that the re-executed test runs its body.
const INSIDE: &str = "REDLOCKD_FAULT_SUITE_NETNS";

/// Whether this process is a scenario's run inside its namespace.
pub fn inside() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// Run the test `name` of this binary again inside a new network namespace, unless this
/// already is that run. Returns whether the caller should run the scenario's body here.
pub fn enter(name: &str) -> bool {
    if inside() {
        return true;
    }
    let status = run_inside(name, &[]);
    assert!(
        status.success(),
        "scenario {name} failed in its network namespace ({status})"
    );
    false
}

/// Run the test `name` of this binary inside a new network namespace of its own, with
/// `envs` set, and say how it ended.
pub fn run_inside(name: &str, envs: &[(&str, String)]) -> std::process::ExitStatus {
    let exe = std::env::current_exe().expect("the test binary");
    // `ip` and `nft` live in sbin, which a non-login PATH may lack.
    let path = format!(
        "{}:/usr/sbin:/sbin",
        std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
    );
    Command::new("unshare")
        .env("PATH", path)
        .args(["--net", "--fork", "--kill-child", "--", "sh", "-c"])
        .arg(r#"ip link set lo up && exec "$0" --exact "$1" --nocapture --test-threads 1 --include-ignored"#)
        .arg(exe)
        .arg(name)
        .env(INSIDE, "1")
        .envs(envs.iter().map(|(k, v)| (k, v)))
        .status()
        .expect("unshare (util-linux) runs")
}

/// The address replica `r` uses to reach the masters.
pub fn replica_host(r: usize) -> String {
    format!("127.0.0.{}", r + 2)
}

/// What the firewall does to the traffic between one replica and one master port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cut {
    /// Nothing gets through, either way: requests time out.
    Partition { replica: usize, port: u16 },
    /// Requests arrive and are applied; the replies are dropped.
    LoseReplies { replica: usize, port: u16 },
}

/// The rules in force, rewritten as a whole on every change.
#[derive(Default)]
pub struct Firewall {
    cuts: BTreeSet<Cut>,
}

impl Firewall {
    pub fn add(&mut self, cut: Cut) {
        self.cuts.insert(cut);
        self.apply();
    }

    pub fn remove(&mut self, cut: &Cut) {
        self.cuts.remove(cut);
        self.apply();
    }

    pub fn clear(&mut self) {
        self.cuts.clear();
        self.apply();
    }

    fn apply(&self) {
        let mut script = String::from(
            "table inet faults\ndelete table inet faults\ntable inet faults {\n  chain output {\n    type filter hook output priority 0; policy accept;\n",
        );
        for cut in &self.cuts {
            let rule = match cut {
                Cut::Partition { replica, port } => format!(
                    "    ip daddr {host} tcp dport {port} drop\n    ip saddr {host} tcp sport {port} drop\n",
                    host = replica_host(*replica)
                ),
                Cut::LoseReplies { replica, port } => format!(
                    "    ip saddr {host} tcp sport {port} drop\n",
                    host = replica_host(*replica)
                ),
            };
            script.push_str(&rule);
        }
        script.push_str("  }\n}\n");
        let mut child = Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("nft (nftables) runs");
        use std::io::Write as _;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(script.as_bytes())
            .expect("write the rules");
        let status = child.wait().expect("nft");
        assert!(status.success(), "nft refused:\n{script}");
    }
}
