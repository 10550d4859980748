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

/// A `consume --group` process and what it printed so far.
struct Member {
    child: std::process::Child,
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Member {
    fn spawn(broker: &Broker, args: &[&str]) -> Member {
        let mut child = broker
            .cli(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn consume --group");
        let rx = lines_of(child.stdout.take().expect("stdout"));
        Member { child, rx, seen: Vec::new() }
    }

    fn drain(&mut self) {
        while let Ok(line) = self.rx.try_recv() {
            self.seen.push(line);
        }
    }

    fn seen_set(&self) -> BTreeSet<String> {
        self.seen.iter().cloned().collect()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Produces `m<i>` keyed by `k<i>`, so the records spread over partitions.
fn produce_keyed(broker: &Broker, topic: &str, range: std::ops::Range<u32>) -> BTreeSet<String> {
    let lines: Vec<String> = range.clone().map(|i| format!("k{i}:m{i:04}")).collect();
    broker.ok(&["produce", topic, "--key-separator", ":"], &(lines.join("\n") + "\n"));
    range.map(|i| format!("m{i:04}")).collect()
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stable_with(broker: &Broker, group: &str, members: usize) -> bool {
    let out = broker.run(&["group", "describe", group, "--output", "json"], "");
    if !out.status.success() {
        return false; // not created yet
    }
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    d["state"] == "Stable" && d["members"].as_array().map_or(0, Vec::len) == members
}

/// Two members split a topic, each record to one of them; one is killed
/// with SIGKILL: the coordinator expels it after its session timeout, the
/// survivor takes its partitions from their last commit, and nothing is
/// lost (at-least-once: only what the dead member printed after its last
/// commit is printed again).
#[test]
fn a_killed_member_is_expelled_and_the_survivor_loses_nothing() {
    let broker = start();
    broker.ok(&["topic", "create", "work", "--partitions", "4"], "");
    let args = ["consume", "work", "--group", "crew", "--from-beginning", "--session-timeout-ms", "1500"];
    let mut a = Member::spawn(&broker, &args);
    let mut b = Member::spawn(&broker, &args);
    wait_until("two stable members", COMMAND_DEADLINE, || stable_with(&broker, "crew", 2));
    let first = produce_keyed(&broker, "work", 0..200);
    wait_until("the first batch", COMMAND_DEADLINE, || {
        a.drain();
        b.drain();
        a.seen_set().union(&b.seen_set()).cloned().collect::<BTreeSet<_>>() == first
    });
    assert!(!a.seen.is_empty() && !b.seen.is_empty(), "both members got partitions");
    assert!(a.seen_set().is_disjoint(&b.seen_set()), "every record went to exactly one member");
    assert_eq!(a.seen.len() + b.seen.len(), first.len());

    // Idle for a while, each member commits what it printed; then a batch
    // the killed member prints but (most likely) has not committed yet.
    std::thread::sleep(Duration::from_millis(2500));
    let mid = produce_keyed(&broker, "work", 200..300);
    wait_until("the middle batch", COMMAND_DEADLINE, || {
        a.drain();
        b.drain();
        a.seen_set().union(&b.seen_set()).cloned().collect::<BTreeSet<_>>()
            == first.union(&mid).cloned().collect()
    });
    a.child.kill().expect("SIGKILL a member");
    let killed = Instant::now();
    let b_before = b.seen.len();
    let last = produce_keyed(&broker, "work", 300..400);
    wait_until("the survivor to print the last batch", COMMAND_DEADLINE, || {
        b.drain();
        b.seen_set().is_superset(&last)
    });
    let took = killed.elapsed();
    eprintln!("a member killed with SIGKILL: its partitions were consumed again after {took:?}");
    assert!(took >= Duration::from_millis(1000), "not before the session timeout ran out ({took:?})");
    assert!(stable_with(&broker, "crew", 1));
    a.drain();
    let again: Vec<&String> = b.seen[b_before..].iter().filter(|l| !last.contains(*l)).collect();
    assert!(again.iter().all(|l| mid.contains(*l) && a.seen.contains(l)), "re-delivered: {again:?}");
    eprintln!(
        "re-delivered after the kill: {} records (the dead member printed {} of the middle batch)",
        again.len(),
        a.seen.iter().filter(|l| mid.contains(*l)).count()
    );
    let all: BTreeSet<String> = a.seen_set().union(&b.seen_set()).cloned().collect();
    assert_eq!(all.len(), 400, "nothing lost");
    signal_and_wait(&mut b.child, "-TERM", "the survivor on SIGTERM");
    let d = describe(&broker, "crew");
    assert_eq!(committed_total(&d), 400, "{d}");
}

/// A static member killed and restarted within its session timeout gets
/// its partitions back: same generation (no rebalance), same assignment,
/// the other member undisturbed.
#[test]
fn a_static_member_restarted_in_time_keeps_its_partitions_without_a_rebalance() {
    let broker = start();
    broker.ok(&["topic", "create", "pinned", "--partitions", "4"], "");
    let member = |id: &str| {
        Member::spawn(
            &broker,
            // From the beginning: the restarted member has nothing committed
            // yet and may join after the batch below is produced.
            &[
                "consume",
                "pinned",
                "--group",
                "statics",
                "--from-beginning",
                "--instance-id",
                id,
                "--session-timeout-ms",
                "8000",
            ],
        )
    };
    let mut a = member("a");
    let mut b = member("b");
    wait_until("two stable members", COMMAND_DEADLINE, || stable_with(&broker, "statics", 2));
    let assignment_of = |d: &serde_json::Value, instance: &str| -> serde_json::Value {
        d["members"].as_array().unwrap().iter().find(|m| m["instance_id"] == instance).expect("member")
            ["assignment"]
            .clone()
    };
    let before = describe(&broker, "statics");
    a.child.kill().expect("SIGKILL the static member");
    let mut a2 = member("a");
    // The restarted member prints records of its partitions again.
    let batch = produce_keyed(&broker, "pinned", 0..100);
    wait_until("the group to print the batch", COMMAND_DEADLINE, || {
        a2.drain();
        b.drain();
        a2.seen_set().union(&b.seen_set()).cloned().collect::<BTreeSet<_>>() == batch
    });
    assert!(!a2.seen.is_empty(), "the restarted member consumes");
    let after = describe(&broker, "statics");
    assert_eq!(after["generation"], before["generation"], "no rebalance: {before} -> {after}");
    assert_eq!(assignment_of(&after, "a"), assignment_of(&before, "a"));
    assert_eq!(assignment_of(&after, "b"), assignment_of(&before, "b"));
    a.drain();
    assert!(a.seen.is_empty());
}

/// Committed offsets survive a broker SIGKILL: after the restart the group
/// resumes exactly at its commit.
#[test]
fn committed_offsets_survive_a_broker_sigkill() {
    let mut broker = start();
    broker.ok(&["topic", "create", "durable", "--partitions", "3"], "");
    let first = produce_keyed(&broker, "durable", 0..100);
    let out = broker
        .ok(&["consume", "durable", "--group", "keep", "--from-beginning", "--max-messages", "100"], "");
    assert_eq!(out.lines().map(str::to_string).collect::<BTreeSet<_>>(), first);
    let second = produce_keyed(&broker, "durable", 100..150);
    broker.kill_and_restart();
    let out = broker.ok(&["consume", "durable", "--group", "keep", "--idle-timeout-ms", "3000"], "");
    let got: Vec<String> = out.lines().map(str::to_string).collect();
    assert_eq!(got.len(), second.len(), "exactly the records after the commit: {got:?}");
    assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), second);
}
