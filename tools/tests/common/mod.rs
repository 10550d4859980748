//! Shared by the end-to-end tests: start the real `shardlog serve` on
//! 127.0.0.1 port 0 and read its ready line.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_shardlog");

/// What the ready line says.
pub struct Ready {
    pub listen: String,
    pub shard_ports: Vec<u16>,
}

/// Spawns `shardlog serve` with `shards` unpinned shards on `dir` and waits
/// for its ready line.
pub fn serve(dir: &Path, shards: usize) -> (Child, Ready) {
    let mut child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--no-pin-cores",
            "--shards",
            &shards.to_string(),
            "--data-dir",
        ])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn shardlog serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("ready line");
    assert!(line.starts_with("shardlog ready: "), "unexpected first line {line:?}");
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in ready line {line:?}"))
            .to_string()
    };
    let listen = field("listen=");
    let shard_ports = field("shard_ports=").split(',').map(|p| p.parse().expect("port")).collect();
    (child, Ready { listen, shard_ports })
}
