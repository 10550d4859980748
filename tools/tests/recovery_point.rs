//! Recovery points end to end (issue 15): a broker that wrote a recovery
//! point and is then SIGKILLed validates only what was written after it,
//! says so in its log, and serves every record it acknowledged.

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
mod common;

use common::{lines_of, wait_for, Broker};
use std::process::Stdio;
use std::time::Duration;

/// Records of 1 KiB: enough for a point (one is due after 1 MiB).
const RECORDS: usize = 3_000;

#[test]
fn sigkill_after_a_recovery_point_scans_only_the_bytes_after_it() {
    let mut broker = Broker::start_with(&["--recovery-point-interval-ms", "100"]);
    broker.ok(&["topic", "create", "rp", "--partitions", "1"], "");
    let lines: Vec<String> = (0..RECORDS).map(|i| format!("{i:08}-{}", "x".repeat(1014))).collect();
    let mut input = lines.join("\n");
    input.push('\n');
    broker.ok(&["produce", "rp", "--partition", "0", "--acks", "1"], &input);

    let point = broker.dir.path().join("rp-0").join("recovery.point");
    wait_for("a recovery point", Duration::from_secs(20), || point.exists().then_some(()));
    // Let every due point be written (one is due per MiB of growth, checked
    // every 100 ms): then less than a MiB is uncovered, and the tail below
    // stays after the last point.
    std::thread::sleep(Duration::from_millis(600));
    // A few more records after the point: the restart must scan them.
    broker.ok(&["produce", "rp", "--partition", "0", "--acks", "1"], "tail-1\ntail-2\n");

    broker.child.kill().expect("SIGKILL the broker");
    broker.child.wait().expect("reap the broker");
    let mut restarted = common::serve_command(broker.dir.path(), 2, &["--recovery-point-interval-ms", "100"])
        .env("RUST_LOG", "shardlog_broker::log=info")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn shardlog serve");
    let stderr = lines_of(restarted.stderr.take().expect("stderr"));
    let (child, ready) = common::wait_ready(restarted);
    broker.child = child;
    broker.listen = ready.listen;

    let line = stderr
        .iter()
        .find(|l| l.contains("recovered the active segment") && l.contains("rp-0"))
        .expect("the restart logs how it recovered rp-0");
    assert!(line.contains("from_recovery_point=true"), "rp-0 was not resumed from its point: {line}");
    let field = |name: &str| -> u64 {
        let at = line.find(name).unwrap_or_else(|| panic!("no {name} in {line}")) + name.len();
        line[at..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().expect(name)
    };
    let (trusted, validated) = (field("trusted_bytes="), field("validated_bytes="));
    eprintln!("restart trusted {trusted} bytes and validated {validated}");
    assert!(trusted >= 1 << 20, "at least the first MiB is trusted: {line}");
    assert!(validated > 0, "the records after the point are validated: {line}");
    assert!(validated < trusted, "the point covers most of the segment: {line}");

    let out = broker.ok(
        &[
            "consume",
            "rp",
            "--partition",
            "0",
            "--from-beginning",
            "--max-messages",
            &(RECORDS + 2).to_string(),
        ],
        "",
    );
    let got: Vec<&str> = out.lines().collect();
    assert_eq!(got.len(), RECORDS + 2, "every acknowledged record is served after the restart");
    assert!(got[..RECORDS].iter().zip(&lines).all(|(a, b)| a == b), "records in order and intact");
    assert_eq!(&got[RECORDS..], ["tail-1", "tail-2"]);
}
