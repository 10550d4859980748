//! Build script shared by the `shardlog` and `shardlog-bench` packages: it
//! embeds the commit the binary is built from as `SHARDLOG_BUILD_SHA` (12
//! hex digits, `-dirty` when tracked sources or manifests ([`BUILT_FROM`])
//! differ from it, `unknown` without git), so a report names the build it
//! measured rather than whatever the source tree holds when it runs.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// What a binary is built from, relative to the workspace root: edits
/// anywhere else (docs, reports) do not change it.
const BUILT_FROM: [&str; 8] =
    ["broker", "client", "schema", "tools", "bench", "ops/build", "Cargo.toml", "Cargo.lock"];

fn main() {
    let sha = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(sha) if !sha.is_empty() => {
            let root = git(&["rev-parse", "--show-toplevel"]).unwrap_or_else(|| "..".to_owned());
            let mut args = vec!["-C", root.as_str(), "status", "--porcelain", "--untracked-files=no", "--"];
            args.extend(BUILT_FROM);
            let dirty = git(&args).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{sha}-dirty")
            } else {
                sha
            }
        }
        _ => "unknown".to_owned(),
    };
    println!("cargo:rustc-env=SHARDLOG_BUILD_SHA={sha}");
    // Run again when HEAD moves or a tracked source changes.
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let git_dir = Path::new(&git_dir);
        for f in ["HEAD", "index"] {
            println!("cargo:rerun-if-changed={}", git_dir.join(f).display());
        }
        if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", git_dir.join(head_ref).display());
        }
    }
    for path in BUILT_FROM {
        println!("cargo:rerun-if-changed=../{path}");
    }
}
