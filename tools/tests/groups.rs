//! Consumer groups from the command line: `consume --group` members split a
//! topic and commit what they printed; `group list/describe/reset-offsets/
//! delete` see and change the broker-held state. The real `shardlog`
//! binary on both sides.

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
mod common;

use common::{lines_of, signal_and_wait, Broker, COMMAND_DEADLINE};

/// Short group timings so joins and expiries take tenths of seconds.
fn start() -> Broker {
    Broker::start_with(&[
        "--group-initial-rebalance-delay-ms",
        "200",
        "--group-min-session-timeout-ms",
        "300",
    ])
}

fn describe(broker: &Broker, group: &str) -> serde_json::Value {
    serde_json::from_str(&broker.ok(&["group", "describe", group, "--output", "json"], "")).expect("json")
}

fn committed_total(d: &serde_json::Value) -> u64 {
    d["partitions"].as_array().expect("partitions").iter().map(|p| p["committed"].as_u64().unwrap_or(0)).sum()
}

fn produce_lines(broker: &Broker, topic: &str, range: std::ops::Range<u32>) -> BTreeSet<String> {
    let lines: Vec<String> = range.map(|i| format!("m{i:03}")).collect();
    broker.ok(&["produce", topic], &(lines.join("\n") + "\n"));
    lines.into_iter().collect()
}

/// A group resumes where it stopped: a member that printed 25 of 40
/// records committed exactly those, the next member prints the other 15;
/// reset-offsets rewinds the group; list and describe show it.
#[test]
fn consume_group_commits_what_it_printed_and_resumes() {
    let broker = start();
    broker.ok(&["topic", "create", "g", "--partitions", "4"], "");
    let all = produce_lines(&broker, "g", 0..40);

    let first =
        broker.ok(&["consume", "g", "--group", "cli", "--from-beginning", "--max-messages", "25"], "");
    let first: Vec<String> = first.lines().map(str::to_string).collect();
    assert_eq!(first.len(), 25);
    let d = describe(&broker, "cli");
    assert_eq!(d["state"], "Empty", "{d}");
    assert_eq!(committed_total(&d), 25, "committed offsets must cover exactly what was printed: {d}");

    let second = broker.ok(&["consume", "g", "--group", "cli", "--idle-timeout-ms", "3000"], "");
    let mut seen: BTreeSet<String> = first.iter().cloned().collect();
    for line in second.lines() {
        assert!(seen.insert(line.to_string()), "{line} printed twice");
    }
    assert_eq!(seen, all, "the two members together printed every record once");
    let d = describe(&broker, "cli");
    assert_eq!(committed_total(&d), 40, "{d}");
    for p in d["partitions"].as_array().unwrap() {
        assert_eq!(p["lag"], 0, "{d}");
    }

    let list = broker.ok(&["group", "list"], "");
    assert!(list.lines().any(|l| l.starts_with("cli\t")), "{list}");

    // Rewind: to the start, to an offset (clamped into the log), by time.
    broker.ok(&["group", "reset-offsets", "cli", "--topic", "g", "--to-earliest"], "");
    assert_eq!(committed_total(&describe(&broker, "cli")), 0);
    let again = broker.ok(&["consume", "g", "--group", "cli", "--max-messages", "40"], "");
    assert_eq!(again.lines().map(str::to_string).collect::<BTreeSet<_>>(), all);
    broker.ok(&["group", "reset-offsets", "cli", "--topic", "g", "--to-offset", "1000000"], "");
    assert_eq!(committed_total(&describe(&broker, "cli")), 40, "an offset past the end is clamped to it");
    broker
        .ok(&["group", "reset-offsets", "cli", "--topic", "g", "--to-datetime", "1970-01-01T00:00:00Z"], "");
    assert_eq!(committed_total(&describe(&broker, "cli")), 0);
    broker.ok(&["group", "reset-offsets", "cli", "--topic", "g", "--to-latest"], "");
    assert_eq!(committed_total(&describe(&broker, "cli")), 40);
    let err = broker.fails(&["group", "reset-offsets", "cli", "--topic", "nope", "--to-latest"]);
    assert!(err.contains("nope"), "{err}");
}

/// While a member runs, the group cannot be reset or deleted; SIGTERM makes
/// the member commit what it printed and leave, after which delete works.
#[test]
fn a_live_member_blocks_reset_and_delete_until_sigterm() {
    let broker = start();
    broker.ok(&["topic", "create", "live", "--partitions", "2"], "");
    let mut member = broker
        .cli(&["consume", "live", "--group", "watchers", "--session-timeout-ms", "3000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn member");
    let rx = lines_of(member.stdout.take().expect("stdout"));
    // The member starts at the log end once it has joined: produce until it
    // prints, then a known batch.
    let deadline = Instant::now() + COMMAND_DEADLINE;
    loop {
        assert!(Instant::now() < deadline, "the member printed nothing");
        broker.ok(&["produce", "live"], "probe\n");
        if rx.recv_timeout(Duration::from_millis(500)).is_ok() {
            break;
        }
    }
    let batch = produce_lines(&broker, "live", 0..20);
    let mut got = BTreeSet::new();
    while got.len() < batch.len() {
        let line = rx.recv_timeout(Duration::from_secs(20)).expect("member stopped printing");
        if line != "probe" {
            got.insert(line);
        }
    }
    assert_eq!(got, batch);

    let d = describe(&broker, "watchers");
    assert_eq!(d["state"], "Stable", "{d}");
    assert_eq!(d["members"].as_array().unwrap().len(), 1, "{d}");
    let owned: usize = d["members"][0]["assignment"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["partitions"].as_array().unwrap().len())
        .sum();
    assert_eq!(owned, 2, "the only member owns both partitions: {d}");
    let err = broker.fails(&["group", "reset-offsets", "watchers", "--topic", "live", "--to-earliest"]);
    assert!(err.contains("active member"), "{err}");
    let err = broker.fails(&["group", "delete", "watchers"]);
    assert!(err.to_lowercase().contains("empty"), "{err}");

    signal_and_wait(&mut member, "-TERM", "consume --group on SIGTERM");
    let d = describe(&broker, "watchers");
    assert_eq!(d["state"], "Empty", "a dynamic member leaves on SIGTERM: {d}");
    for p in d["partitions"].as_array().unwrap() {
        assert_eq!(p["lag"], 0, "SIGTERM commits everything printed: {d}");
    }
    broker.ok(&["group", "delete", "watchers"], "");
    let list = broker.ok(&["group", "list"], "");
    assert!(!list.lines().any(|l| l.starts_with("watchers\t")), "{list}");
}
