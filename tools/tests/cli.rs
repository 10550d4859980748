//! End to end through the command line: the real `shardlog` binary serves on
//! 127.0.0.1 (port 0, temp data directory) and the same binary's client
//! commands talk to it through stdin/stdout, as scripts would.

use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
mod common;

use common::{lines_of, signal_and_wait, Broker, BIN, COMMAND_DEADLINE};

fn lines(s: &str) -> Vec<String> {
    s.lines().map(str::to_string).collect()
}

#[test]
fn produce_then_consume_round_trips_stdin_to_stdout() {
    let broker = Broker::start();
    broker.ok(&["topic", "create", "lines", "--partitions", "3"], "");

    // One partition: exact order is preserved.
    let input: Vec<String> = (0..500).map(|i| format!("message {i} with some text")).collect();
    broker.ok(&["produce", "lines", "--partition", "1"], &(input.join("\n") + "\n"));
    let out =
        broker.ok(&["consume", "lines", "--partition", "1", "--from-beginning", "--max-messages", "500"], "");
    assert_eq!(lines(&out), input);

    // Keyed lines over all partitions: every line comes back once.
    let keyed: Vec<String> = (0..300).map(|i| format!("key{}:value {i}", i % 7)).collect();
    broker.ok(&["produce", "lines", "--key-separator", ":", "--acks", "all"], keyed.join("\n"));
    let out = broker.ok(
        &[
            "consume",
            "lines",
            "--from-beginning",
            "--max-messages",
            "800",
            "--format",
            "key-value",
            "--key-separator",
            ":",
        ],
        "",
    );
    let mut got = lines(&out);
    assert_eq!(got.len(), 800);
    got.retain(|l| l.starts_with("key"));
    got.sort();
    let mut want = keyed.clone();
    want.sort();
    assert_eq!(got, want);

    // JSON format carries partition, offset and key.
    let out = broker.ok(
        &[
            "consume",
            "lines",
            "--partition",
            "1",
            "--offset",
            "499",
            "--max-messages",
            "1",
            "--format",
            "json",
        ],
        "",
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json line");
    assert_eq!(v["offset"], 499);
    assert_eq!(v["partition"], 1);
    assert_eq!(v["value"], "message 499 with some text");
    assert_eq!(v["key"], serde_json::Value::Null);
}

/// Keys and values are bytes: stdin that is not UTF-8 is sent as it is, and
/// `--format json` shows bytes that are not UTF-8 as base64 under `*_base64`.
#[test]
fn produce_sends_bytes_and_json_marks_non_utf8_as_base64() {
    let broker = Broker::start();
    broker.ok(&["topic", "create", "bytes", "--partitions", "1"], "");
    // The issue's input: an empty line, then 00 01 ff.
    let out = broker.run(&["produce", "bytes"], b"\n\x00\x01\xff\n");
    assert!(out.status.success(), "produce failed: {}", String::from_utf8_lossy(&out.stderr));
    broker.ok(&["produce", "bytes", "--key-separator", ":"], b"k\xfe:\xffv\ntext:plain\r\n");

    let consume = |format: &str| {
        let args = ["consume", "bytes", "--from-beginning", "--max-messages", "4", "--format", format];
        let out = broker.run(&args, "");
        assert!(out.status.success(), "consume failed: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    assert_eq!(consume("value"), b"\n\x00\x01\xff\n\xffv\nplain\r\n", "values come back byte for byte");
    let json = String::from_utf8(consume("json")).expect("json output is UTF-8");
    let v: Vec<serde_json::Value> =
        json.lines().map(|l| serde_json::from_str(l).expect("one JSON object per line")).collect();
    assert_eq!(v.len(), 4);
    assert_eq!((&v[0]["value"], &v[0]["key"]), (&serde_json::json!(""), &serde_json::Value::Null));
    assert_eq!(v[1]["value_base64"], "AAH/");
    assert!(v[1].get("value").is_none(), "bytes that are not UTF-8 never appear as text: {}", v[1]);
    assert_eq!(
        (&v[2]["key_base64"], &v[2]["value_base64"]),
        (&serde_json::json!("a/4="), &serde_json::json!("/3Y="))
    );
    assert!(v[2].get("key").is_none() && v[2].get("value").is_none(), "{}", v[2]);
    assert_eq!((&v[3]["key"], &v[3]["value"]), (&serde_json::json!("text"), &serde_json::json!("plain\r")));
    let offsets: Vec<u64> = v.iter().map(|o| o["offset"].as_u64().expect("offset")).collect();
    assert_eq!(offsets, [0, 1, 2, 3]);
}

#[test]
fn topic_create_list_describe_delete() {
    let broker = Broker::start();
    broker.ok(&["topic", "create", "alpha", "--partitions", "4", "--config", "retention.ms=60000"], "");
    broker.ok(&["topic", "create", "beta"], "");
    assert_eq!(lines(&broker.ok(&["topic", "list"], "")), vec!["alpha", "beta"]);
    assert_eq!(
        lines(&broker.ok(&["topic", "list", "--include-internal"], "")),
        vec!["__consumer_offsets", "alpha", "beta"]
    );

    broker.ok(&["produce", "alpha", "--partition", "2"], "a\nb\nc\n");
    let out = broker.ok(&["topic", "describe", "alpha"], "");
    assert!(out.contains("partitions: 4"), "{out}");
    assert!(out.contains("retention.ms=60000"), "{out}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() == 9 && w[0].parse::<u32>().is_ok())
        .collect();
    assert_eq!(rows.len(), 4, "{out}");
    for row in &rows {
        let port: u16 = row[3].rsplit(':').next().and_then(|p| p.parse().ok()).expect("address with a port");
        assert_ne!(port, 0);
        let end = if row[0] == "2" { "3" } else { "0" };
        assert_eq!((row[4], row[5]), ("0", end), "start and end offsets of partition {}", row[0]);
        // One broker: the only replica is the leader, and it is in sync.
        assert_eq!((row[6], row[7]), (row[1], row[1]), "replicas and ISR of partition {}", row[0]);
    }

    let listed: serde_json::Value =
        serde_json::from_str(&broker.ok(&["topic", "list", "--output", "json"], "")).expect("list is JSON");
    assert_eq!(listed, serde_json::json!(["alpha", "beta"]));
    let described: serde_json::Value =
        serde_json::from_str(&broker.ok(&["topic", "describe", "alpha", "--output", "json"], ""))
            .expect("describe is JSON");
    assert_eq!(described["name"], "alpha");
    assert_eq!(described["configs"]["retention.ms"], "60000");
    let parts = described["partitions"].as_array().expect("partitions");
    assert_eq!(parts.len(), 4);
    assert_eq!(parts[2]["partition"], 2);
    assert_eq!((parts[2]["start_offset"].as_u64(), parts[2]["end_offset"].as_u64()), (Some(0), Some(3)));
    assert!(parts.iter().all(|p| p["leader_port"].as_u64().is_some_and(|port| port > 0)));

    let dup = broker.run(&["topic", "create", "alpha", "--partitions", "1"], "");
    assert!(!dup.status.success());
    assert!(String::from_utf8_lossy(&dup.stderr).contains("TopicAlreadyExists"));

    broker.ok(&["topic", "delete", "alpha"], "");
    assert_eq!(lines(&broker.ok(&["topic", "list"], "")), vec!["beta"]);
    let gone = broker.run(&["topic", "describe", "alpha"], "");
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("unknown topic"));
}

#[test]
fn produce_to_unknown_topic_fails_with_a_clear_error() {
    let broker = Broker::start();
    let out = broker.run(&["produce", "no-such-topic"], "one\ntwo\n");
    assert!(!out.status.success(), "must exit non-zero");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown topic `no-such-topic`"), "stderr: {stderr}");

    let out = broker.run(&["produce", "no-such-topic", "--key-separator", ":"], "no separator here\n");
    assert!(!out.status.success());
}

#[test]
fn settings_file_and_flags_precedence() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("client.toml");
    std::fs::write(&file, format!("bootstrap = \"{}\"\n", broker.listen)).expect("write config");
    let file = file.to_str().expect("utf8 path");
    // The file supplies the bootstrap address when neither flag nor env does.
    let out = Command::new(BIN)
        .args(["topic", "create", "from-file", "--config-file", file])
        .env_remove("SHARDLOG_BOOTSTRAP")
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(BIN)
        .args(["topic", "list", "--config", file])
        .env_remove("SHARDLOG_BOOTSTRAP")
        .output()
        .expect("run");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "from-file");
    // A flag wins over the file: this address has nothing listening.
    let out = Command::new(BIN)
        .args(["topic", "list", "--config", file, "--bootstrap", "127.0.0.1:1"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("127.0.0.1:1"));
}

#[test]
fn consume_follows_until_interrupted() {
    let broker = Broker::start();
    broker.ok(&["topic", "create", "follow"], "");
    let mut child = broker
        .cli(&["consume", "follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn consume");
    let rx = lines_of(child.stdout.take().expect("stdout"));
    // The consumer starts at the log end; keep producing until it prints one.
    let deadline = Instant::now() + COMMAND_DEADLINE;
    let first = loop {
        assert!(Instant::now() < deadline, "consume printed nothing");
        broker.ok(&["produce", "follow"], "live\n");
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
            break line;
        }
    };
    assert_eq!(first, "live");
    signal_and_wait(&mut child, "-INT", "consume on SIGINT (Ctrl-C must be a clean exit)");
}

/// `--offset` past the log end: the broker answers OffsetOutOfRange and the
/// consumer applies `--offset-reset` (saying so on stderr), or fails with
/// `none`; it never starts silently somewhere else.
#[test]
fn consume_past_the_log_end_applies_the_offset_reset_policy() {
    let broker = Broker::start();
    broker.ok(&["topic", "create", "short"], "");
    broker.ok(&["produce", "short"], "only\n");
    let consume = ["consume", "short", "--partition", "0", "--offset", "1000", "--format", "json"];
    let moved = |policy: &str, to: u64| {
        format!(
            "offset 1000 is out of range for short/0 (readable offsets 0 up to 1); \
             --offset-reset {policy} moved it to offset {to}"
        )
    };

    let out =
        broker.run(&[&consume[..], &["--offset-reset", "earliest", "--max-messages", "1"]].concat(), "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains(&moved("earliest", 0)), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!((&v["offset"], &v["value"]), (&serde_json::json!(0), &serde_json::json!("only")));

    let out =
        broker.run(&[&consume[..], &["--offset-reset", "none", "--idle-timeout-ms", "10000"]].concat(), "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(
        stderr.contains("offset 1000 is out of range for short/0: readable offsets are 0 up to 1")
            && stderr.contains("the offset reset policy is none"),
        "{stderr}"
    );

    // The default, latest: the log end, so only records produced afterwards.
    let mut child = broker
        .cli(&[&consume[..], &["--max-messages", "1"]].concat())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn consume");
    let rx = lines_of(child.stderr.take().expect("stderr"));
    let warning = rx.recv_timeout(COMMAND_DEADLINE).expect("a warning on stderr");
    assert!(warning.contains(&moved("latest", 1)), "{warning}");
    broker.ok(&["produce", "short"], "next\n");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let out = rx.recv_timeout(COMMAND_DEADLINE).expect("consume exits after one message").expect("wait");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!((&v["offset"], &v["value"]), (&serde_json::json!(1), &serde_json::json!("next")));
}

#[test]
fn log_dump_prints_the_batches_of_a_segment() {
    let broker = Broker::start();
    broker.ok(&["topic", "create", "dumped"], "");
    broker.ok(&["produce", "dumped"], "first\nsecond\n");
    let dir = broker.dir.path().join("dumped-0");
    let segment = std::fs::read_dir(&dir)
        .expect("partition directory")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .expect("a .log segment");
    let out = broker.ok(&["log", "dump", segment.to_str().expect("utf8"), "--records"], "");
    assert!(out.contains("first") && out.contains("second"), "{out}");
}

/// The issue's case: `--admin-listen` on shard 0's port (the public port + 1)
/// must not start a broker whose clients then time out.
#[test]
fn serve_refuses_colliding_ports_and_names_both_uses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let (listen, admin) = (format!("127.0.0.1:{port}"), format!("127.0.0.1:{}", port + 1));
    let out = Command::new(BIN)
        .args(["serve", "--listen", &listen, "--admin-listen", &admin, "--shards", "2", "--no-pin-cores"])
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("SHARDLOG_CONFIG")
        .output()
        .expect("run shardlog serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "serve started: {}", String::from_utf8_lossy(&out.stdout));
    assert!(out.stdout.is_empty(), "no ready line: {}", String::from_utf8_lossy(&out.stdout));
    assert!(
        stderr.contains(&format!("port {} is wanted twice", port + 1))
            && stderr.contains("shard 0's port (public port + 1)")
            && stderr.contains("the admin listener (--admin-listen)"),
        "{stderr}"
    );
}

#[test]
fn log_format_json_writes_one_object_per_line_with_the_connection_span() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = common::serve_command(dir.path(), 1, &["--log-format", "json"]);
    cmd.env("RUST_LOG", "info").stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn shardlog serve");
    let stderr = child.stderr.take().expect("stderr");
    let (child, ready) = common::wait_ready(child);
    // Killed if an assertion fails first (no broker left behind).
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Reap(child);
    let errors = lines_of(stderr);

    // A frame longer than any limit: the broker closes the connection with
    // a warning logged inside the connection's span.
    let mut sock = std::net::TcpStream::connect(&ready.listen).expect("connect");
    sock.write_all(&[0xff, 0xff, 0xff, 0xf0]).expect("write");
    let mut rest = Vec::new();
    let _closed = sock.read_to_end(&mut rest);

    let deadline = Instant::now() + COMMAND_DEADLINE;
    let mut objects = Vec::new();
    let bad_frame = loop {
        let line = errors
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("no bad-frame line");
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        if v["fields"]["message"] == "closing connection after a bad frame" {
            break v;
        }
        objects.push(v);
    };
    assert_eq!(bad_frame["level"], "WARN", "{bad_frame}");
    assert!(bad_frame["threadName"].as_str().is_some_and(|t| t.starts_with("shard-0")), "{bad_frame}");
    assert_eq!(bad_frame["fields"]["error"], "RequestTooLarge", "{bad_frame}");
    let span = &bad_frame["span"];
    assert_eq!(span["name"], "conn", "{bad_frame}");
    assert_eq!(span["listener"], "public", "{bad_frame}");
    assert_eq!(span["peer"], sock.local_addr().expect("addr").to_string(), "{bad_frame}");
    assert!(
        objects.iter().all(|v| v["level"].is_string() && v["timestamp"].is_string()),
        "start-up lines: {objects:?}"
    );
    signal_and_wait(&mut child.0, "-TERM", "broker");
    for line in errors.try_iter() {
        serde_json::from_str::<serde_json::Value>(&line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
    }
}

#[test]
fn produce_is_idempotent_by_default_and_stamps_batches_with_a_producer_id() {
    let broker = Broker::start();
    broker.ok(&["topic", "create", "idem"], "");
    broker.ok(&["produce", "idem"], "one\ntwo\n");
    broker.ok(&["produce", "idem", "--no-idempotence"], "plain\n");
    let segment = broker.dir.path().join("idem-0").join(format!("{:020}.log", 0));
    let out = broker.ok(&["log", "dump", segment.to_str().expect("utf8")], "");
    let ids: Vec<&str> =
        out.lines().filter_map(|l| l.split("producerId: ").nth(1)?.split(' ').next()).collect();
    assert_eq!(ids.len(), 2, "two batches: {out}");
    assert!(ids[0].parse::<i64>().expect("id") >= 0, "the idempotent batch has an id: {out}");
    assert_eq!(ids[1], "-1", "the plain one has none: {out}");
    assert_eq!(
        broker.ok(&["consume", "idem", "--from-beginning", "--max-messages", "3"], ""),
        "one\ntwo\nplain\n"
    );
}
