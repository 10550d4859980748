//! The serving path over real sockets: a broker started in-process
//! (`shardlog_broker::start`) on 127.0.0.1 with a temp data directory, spoken
//! to with raw frames, so these tests do not depend on the client crate.

mod wire_support;

use shardlog_broker::config::BrokerConfig;
use shardlog_broker::{start, BrokerHandle};
use shardlog_schema::types::shard_for;
use shardlog_schema::wire::{self, ApiKey, ErrorCode};
use shardlog_schema::PartitionId;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use wire_support::{batch_of, broker, values, Conn};

#[test]
fn produce_fetch_round_trip_through_every_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), 2);
    let ports = handle.ready.shard_ports.clone();
    let mut public = Conn::open(handle.ready.listen.port());
    assert_eq!(public.create_topic("events", 4), ErrorCode::None);
    assert_eq!(public.create_topic("events", 4), ErrorCode::TopicAlreadyExists);
    assert_eq!(public.create_topic("bad/name", 1), ErrorCode::InvalidTopicName);
    for p in 0..4u32 {
        let owner = shard_for("events", PartitionId(p), 2).0 as usize;
        let other = 1 - owner;
        // Through the owner's port, then through the other shard (forwarded).
        let mut own = Conn::open(ports[owner]);
        let mut fwd = Conn::open(ports[other]);
        assert_eq!(own.produce("events", p, &batch_of(&["a", "b"])), (ErrorCode::None, 0));
        assert_eq!(fwd.produce("events", p, &batch_of(&["c"])), (ErrorCode::None, 2));
        for conn in [&mut own, &mut fwd, &mut public] {
            let (err, data, hw) = conn.fetch("events", p, 1, 0);
            assert_eq!(err, ErrorCode::None);
            assert_eq!(hw, 3);
            let got: Vec<_> = values(&data).into_iter().filter(|(o, _)| *o >= 1).collect();
            assert_eq!(got, vec![(1, b"b".to_vec()), (2, b"c".to_vec())]);
        }
    }
    let (err, _, _) = public.fetch("events", 0, 99, 0);
    assert_eq!(err, ErrorCode::OffsetOutOfRange);
    let (err, _, _) = public.fetch("nope", 0, 0, 0);
    assert_eq!(err, ErrorCode::UnknownTopicOrPartition);
    let (err, _) = public.produce("events", 9, &batch_of(&["x"]));
    assert_eq!(err, ErrorCode::UnknownTopicOrPartition);
    let mut bad = batch_of(&["x"]);
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert_eq!(public.produce("events", 0, &bad).0, ErrorCode::CorruptMessage);
    handle.shutdown().expect("clean shutdown");

    // Topics and data survive a restart.
    let handle = broker(dir.path(), 2);
    let mut conn = Conn::open(handle.ready.listen.port());
    let (err, data, hw) = conn.fetch("events", 3, 0, 0);
    assert_eq!((err, hw), (ErrorCode::None, 3));
    assert_eq!(values(&data).len(), 3);
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn long_poll_wakes_on_produce() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), 2);
    let port = handle.ready.listen.port();
    let mut admin = Conn::open(port);
    assert_eq!(admin.create_topic("lp", 2), ErrorCode::None);
    for p in 0..2 {
        let waiter = std::thread::spawn(move || {
            let mut c = Conn::open(port);
            let started = std::time::Instant::now();
            let (err, data, _) = c.fetch("lp", p, 0, 10_000);
            (err, values(&data), started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(200));
        let mut producer = Conn::open(port);
        producer.produce("lp", p, &batch_of(&["wake"]));
        let (err, got, waited) = waiter.join().expect("waiter");
        assert_eq!(err, ErrorCode::None);
        assert_eq!(got, vec![(0, b"wake".to_vec())]);
        assert!(waited < Duration::from_secs(5), "fetch waited {waited:?} instead of waking");
    }
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn junk_costs_only_its_own_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), 2);
    let port = handle.ready.listen.port();
    let mut good = Conn::open(port);
    assert_eq!(good.create_topic("j", 1), ErrorCode::None);
    let mut seed: u64 = 42;
    let junk_frames: Vec<Vec<u8>> = (0..200)
        .map(|i| {
            let len = 1 + (i * 37) % 300;
            (0..len)
                .map(|_| {
                    seed =
                        seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    (seed >> 56) as u8
                })
                .collect()
        })
        .collect();
    for (i, junk) in junk_frames.iter().enumerate() {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let mut frame = junk.clone();
        if i % 3 == 0 {
            // A plausible length prefix with garbage behind it.
            let mut f = (junk.len() as u32).to_le_bytes().to_vec();
            f.extend_from_slice(junk);
            frame = f;
        }
        let _ = s.write_all(&frame);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
        if i % 20 == 0 {
            assert_eq!(good.produce("j", 0, &batch_of(&["still here"])).0, ErrorCode::None);
        }
    }
    // Oversized length prefix: typed error, then the connection closes.
    let mut s = Conn::open(port);
    s.stream.write_all(&u32::MAX.to_le_bytes()).expect("write");
    let r = s.recv();
    assert_eq!(r.frame().error(), ErrorCode::RequestTooLarge);
    let mut rest = Vec::new();
    assert_eq!(s.stream.read_to_end(&mut rest).expect("closed"), 0);
    // Unknown API key with a valid envelope: typed error, connection stays.
    let mut c = Conn::open(port);
    c.send(
        ApiKey(77),
        |fbb| {
            let b = wire::ApiVersionsRequest::create(fbb, &wire::ApiVersionsRequestArgs {});
            (wire::RequestBody::ApiVersionsRequest, b.as_union_value())
        },
        &[],
    );
    assert_eq!(c.recv().frame().error(), ErrorCode::UnsupportedApi);
    let (err, data, _) = c.fetch("j", 0, 0, 0);
    assert_eq!(err, ErrorCode::None);
    assert!(values(&data).iter().all(|(_, v)| v == b"still here"));
    handle.shutdown().expect("clean shutdown");
}

fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).expect("connect admin");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}

/// Sum of one counter over shards, e.g. `fetch_bytes_total` with `path="splice"`.
fn counter(text: &str, name: &str, label: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("shardlog_{name}{{")) && l.contains(label))
        .map(|l| l.rsplit(' ').next().expect("value").parse::<u64>().expect("number"))
        .sum()
}

#[test]
fn splice_and_plain_paths_serve_identical_bytes() {
    use shardlog_broker::config::FetchPath;
    let mut served = Vec::new();
    for path in [FetchPath::Splice, FetchPath::Plain] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = BrokerConfig::new(dir.path().to_path_buf(), "127.0.0.1:0".parse().expect("addr"));
        config.shards = 2;
        config.pin_cores = false;
        config.fetch_path = path;
        config.admin_listen = Some("127.0.0.1:0".parse().expect("addr"));
        config.topic_defaults.segment_bytes = 256 << 10; // several segment rolls
        let handle = start(config).expect("broker starts");
        // The owner shard's port: forwarded reads arrive as copies, not file ranges.
        let owner = shard_for("z", PartitionId(0), 2).0 as usize;
        let mut c = Conn::open(handle.ready.shard_ports[owner]);
        assert_eq!(c.create_topic("z", 1), ErrorCode::None);
        let mut expected = Vec::new();
        for i in 0..40 {
            let vals: Vec<String> = (0..20).map(|j| format!("{i}-{j}-{}", "x".repeat(1000))).collect();
            let refs: Vec<&str> = vals.iter().map(String::as_str).collect();
            c.produce("z", 0, &batch_of(&refs));
            expected.extend(vals);
        }
        let mut got = Vec::new();
        let mut raw = Vec::new();
        let mut next = 0i64;
        while (next as usize) < expected.len() {
            let (err, data, _) = c.fetch("z", 0, next, 0);
            assert_eq!(err, ErrorCode::None);
            raw.extend_from_slice(&data);
            for (offset, v) in values(&data) {
                if offset as i64 >= next {
                    got.push(String::from_utf8(v).expect("utf8"));
                    next = offset as i64 + 1;
                }
            }
        }
        assert_eq!(got, expected, "{path:?} served different records");
        let metrics = scrape(handle.ready.admin.expect("admin listener"));
        let (splice, plain) = (
            counter(&metrics, "fetch_bytes_total", "path=\"splice\""),
            counter(&metrics, "fetch_bytes_total", "path=\"plain\""),
        );
        match path {
            FetchPath::Splice => assert!(splice > 0 && plain == 0, "splice {splice} plain {plain}"),
            FetchPath::Plain => assert!(plain > 0 && splice == 0, "splice {splice} plain {plain}"),
        }
        assert_eq!(counter(&metrics, "produce_requests_total", ""), 40);
        served.push(raw);
        handle.shutdown().expect("clean shutdown");
    }
    assert!(served[0] == served[1], "splice and plain responses differ byte for byte");
}

/// A fetch of 200 partitions, none of them in the hot tail, on the plain
/// path: a file range of each (one of 400 KB among ranges of a few KB) and
/// the partial last block from memory; every partition's records come back
/// whole and in its place.
#[test]
fn a_fetch_of_many_cold_partitions_returns_each_ones_records() {
    use shardlog_broker::config::FetchPath;
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker_with(dir.path(), |c| {
        c.shards = 1;
        c.fetch_path = FetchPath::Plain;
        c.hot_tail_partition_bytes = 0;
        c.admin_listen = Some("127.0.0.1:0".parse().expect("addr"));
    });
    let mut c = Conn::open(handle.ready.shard_ports[0]);
    const PARTS: u32 = 200;
    assert_eq!(c.create_topic("cold", PARTS), ErrorCode::None);
    let mut expected = Vec::new();
    for p in 0..PARTS {
        // At least one whole block each: the partial last block of an
        // active segment is served from memory.
        let n = if p == 7 { 400 } else { 5 + p as usize % 3 };
        let vals: Vec<String> = (0..n).map(|i| format!("{p}-{i}-{}", "c".repeat(1000))).collect();
        for batch in vals.chunks(100) {
            let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
            assert_eq!(c.produce("cold", p, &batch_of(&refs)).0, ErrorCode::None);
        }
        expected.push(vals);
    }
    let partitions: Vec<u32> = (0..PARTS).collect();
    let got = c.fetch_many("cold", &partitions, 0);
    assert_eq!(got.len(), PARTS as usize);
    let served: usize = got.iter().map(|(_, _, data)| data.len()).sum();
    for (i, (p, err, data)) in got.into_iter().enumerate() {
        assert_eq!((p, err), (i as u32, ErrorCode::None));
        let vals: Vec<String> =
            values(&data).into_iter().map(|(_, v)| String::from_utf8(v).expect("utf8")).collect();
        assert_eq!(vals, expected[i], "partition {p}");
    }
    let metrics = scrape(handle.ready.admin.expect("admin"));
    // Files (whole blocks of each partition) and memory (each one's
    // partial last block) serve everything; every partition holds more
    // than a block.
    let plain = counter(&metrics, "fetch_bytes_total", "path=\"plain\"");
    let memory = counter(&metrics, "fetch_bytes_total", "path=\"hot_tail\"");
    assert_eq!(plain + memory, served as u64);
    assert!(plain >= u64::from(PARTS) * 4096, "{plain} of {served} bytes read from the files");
    handle.shutdown().expect("clean shutdown");
}

fn broker_with(dir: &std::path::Path, tweak: impl FnOnce(&mut BrokerConfig)) -> BrokerHandle {
    let mut config = BrokerConfig::new(dir.to_path_buf(), "127.0.0.1:0".parse().expect("addr"));
    config.shards = 2;
    config.pin_cores = false;
    tweak(&mut config);
    start(config).expect("broker starts")
}

/// Produces `batches` batches of `per_batch` 1000-byte records; returns the values.
fn fill(c: &mut Conn, topic: &str, batches: usize, per_batch: usize) -> Vec<String> {
    let mut all = Vec::new();
    for i in 0..batches {
        let vals: Vec<String> = (0..per_batch).map(|j| format!("{i}-{j}-{}", "v".repeat(1000))).collect();
        let refs: Vec<&str> = vals.iter().map(String::as_str).collect();
        assert_eq!(c.produce(topic, 0, &batch_of(&refs)).0, ErrorCode::None);
        all.extend(vals);
    }
    all
}

#[test]
fn consumer_vanishing_mid_splice_leaves_broker_healthy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker_with(dir.path(), |c| c.topic_defaults.segment_bytes = 4 << 20);
    let owner = shard_for("big", PartitionId(0), 2).0 as usize;
    let port = handle.ready.shard_ports[owner];
    let mut c = Conn::open(port);
    assert_eq!(c.create_topic("big", 1), ErrorCode::None);
    let expected = fill(&mut c, "big", 60, 50); // ~3 MB over one segment
    for _ in 0..20 {
        // Ask for everything at once, then hang up without reading.
        let mut quitter = Conn::open(port);
        quitter.send(
            ApiKey::Fetch,
            |fbb| {
                let t = fbb.create_string("big");
                let p = wire::FetchPartition::create(
                    fbb,
                    &wire::FetchPartitionArgs {
                        topic: Some(t),
                        partition: 0,
                        fetch_offset: 0,
                        partition_max_bytes: 64 << 20,
                        current_leader_epoch: -1,
                        replica_log_end: -1,
                    },
                );
                let ps = fbb.create_vector(&[p]);
                let b = wire::FetchRequest::create(
                    fbb,
                    &wire::FetchRequestArgs {
                        replica_id: -1,
                        max_wait_ms: 0,
                        min_bytes: 1,
                        max_bytes: 64 << 20,
                        partitions: Some(ps),
                    },
                );
                (wire::RequestBody::FetchRequest, b.as_union_value())
            },
            &[],
        );
        drop(quitter);
    }
    // The next consumer gets every record, byte for byte.
    let mut got = Vec::new();
    let mut next = 0i64;
    while (next as usize) < expected.len() {
        let (err, data, _) = c.fetch("big", 0, next, 0);
        assert_eq!(err, ErrorCode::None);
        for (offset, v) in values(&data) {
            if offset as i64 >= next {
                got.push(String::from_utf8(v).expect("utf8"));
                next = offset as i64 + 1;
            }
        }
    }
    assert!(got == expected, "records differ after consumers vanished mid-send");
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn reads_racing_retention_get_data_or_a_typed_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker_with(dir.path(), |c| {
        c.topic_defaults.segment_bytes = 64 << 10;
        c.topic_defaults.retention_bytes = Some(256 << 10);
        c.retention_check_interval = Duration::from_millis(20);
    });
    let owner = shard_for("churn", PartitionId(0), 2).0 as usize;
    let port = handle.ready.shard_ports[owner];
    let mut producer = Conn::open(port);
    assert_eq!(producer.create_topic("churn", 1), ErrorCode::None);
    let mut reader = Conn::open(port);
    let mut out_of_range = 0;
    let mut checked = 0usize;
    let mut next = 0i64;
    for round in 0..60 {
        let vals: Vec<String> = (0..20).map(|j| format!("{round}-{j}-{}", "r".repeat(1000))).collect();
        let refs: Vec<&str> = vals.iter().map(String::as_str).collect();
        producer.produce("churn", 0, &batch_of(&refs));
        let (err, data, _) = reader.fetch("churn", 0, next, 0);
        match err {
            ErrorCode::None => {
                // Every batch verifies (BatchIter checks length and CRC) and
                // every record is one that was produced.
                for (offset, v) in values(&data) {
                    let s = String::from_utf8(v).expect("utf8");
                    let (r, rest) = s.split_once('-').expect("round");
                    let (j, _) = rest.split_once('-').expect("index");
                    assert_eq!(offset, r.parse::<u64>().expect("n") * 20 + j.parse::<u64>().expect("n"));
                    next = next.max(offset as i64 + 1);
                    checked += 1;
                }
            }
            ErrorCode::OffsetOutOfRange => {
                // Retention moved the start past us: continue from there.
                out_of_range += 1;
                next = list_earliest(&mut reader, "churn");
            }
            other => panic!("unexpected error {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(checked > 0, "read nothing");
    // Reads far behind the log start are typed errors naming the range.
    let (err, _, _) = reader.fetch("churn", 0, 0, 0);
    assert_eq!(
        err,
        ErrorCode::OffsetOutOfRange,
        "retention should have moved the start ({out_of_range} races)"
    );
    handle.shutdown().expect("clean shutdown");
}

fn list_earliest(c: &mut Conn, topic: &str) -> i64 {
    c.send(
        ApiKey::ListOffsets,
        |fbb| {
            let t = fbb.create_string(topic);
            let p = wire::ListOffsetsPartition::create(
                fbb,
                &wire::ListOffsetsPartitionArgs { topic: Some(t), partition: 0, timestamp: -2 },
            );
            let ps = fbb.create_vector(&[p]);
            let b =
                wire::ListOffsetsRequest::create(fbb, &wire::ListOffsetsRequestArgs { partitions: Some(ps) });
            (wire::RequestBody::ListOffsetsRequest, b.as_union_value())
        },
        &[],
    );
    let r = c.recv();
    let f = r.frame();
    let p = f.body_as_list_offsets_response().expect("body").partitions().expect("parts").get(0);
    assert_eq!(p.error(), ErrorCode::None);
    p.offset()
}

#[test]
fn torn_tail_is_truncated_and_the_log_continues() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker_with(dir.path(), |_| {});
    let owner = shard_for("torn", PartitionId(0), 2).0 as usize;
    let mut c = Conn::open(handle.ready.shard_ports[owner]);
    assert_eq!(c.create_topic("torn", 1), ErrorCode::None);
    let expected = fill(&mut c, "torn", 5, 3);
    handle.shutdown().expect("clean shutdown");
    // Simulate a crash mid-write: a torn batch after the valid ones, and no
    // clean-shutdown marker.
    let part = dir.path().join("torn-0");
    for entry in std::fs::read_dir(&part).expect("partition dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
        if !name.ends_with(".log")
            && !name.ends_with(".index")
            && !name.ends_with(".timeindex")
            && !name.contains("meta")
        {
            std::fs::remove_file(&path).expect("remove marker");
        }
    }
    let log = part.join("00000000000000000000.log");
    let valid = std::fs::metadata(&log).expect("log").len();
    let torn = batch_of(&["this batch never finished"]);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&log).expect("open");
        f.write_all_at(&torn[..torn.len() / 2], valid).expect("write torn");
    }
    let handle = broker_with(dir.path(), |_| {});
    let mut c = Conn::open(handle.ready.shard_ports[owner]);
    let (err, data, hw) = c.fetch("torn", 0, 0, 0);
    assert_eq!((err, hw), (ErrorCode::None, expected.len() as i64));
    let got: Vec<String> =
        values(&data).into_iter().map(|(_, v)| String::from_utf8(v).expect("utf8")).collect();
    assert_eq!(got, expected);
    assert_eq!(c.produce("torn", 0, &batch_of(&["after"])), (ErrorCode::None, expected.len() as i64));
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn tail_consumers_are_served_from_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker_with(dir.path(), |c| c.admin_listen = Some("127.0.0.1:0".parse().expect("addr")));
    let owner = shard_for("hot", PartitionId(0), 2).0 as usize;
    let mut c = Conn::open(handle.ready.shard_ports[owner]);
    assert_eq!(c.create_topic("hot", 1), ErrorCode::None);
    let expected = fill(&mut c, "hot", 20, 10); // ~200 KB: well inside the hot tail
    let (err, data, _) = c.fetch("hot", 0, 0, 0);
    assert_eq!(err, ErrorCode::None);
    let got: Vec<String> =
        values(&data).into_iter().map(|(_, v)| String::from_utf8(v).expect("utf8")).collect();
    assert_eq!(got, expected);
    let metrics = scrape(handle.ready.admin.expect("admin"));
    let hot = counter(&metrics, "fetch_bytes_total", "path=\"hot_tail\"");
    let disk = counter(&metrics, "fetch_bytes_total", "path=\"splice\"")
        + counter(&metrics, "fetch_bytes_total", "path=\"plain\"");
    assert_eq!((hot, disk), (data.len() as u64, 0), "tail reads must not touch the disk");
    assert!(counter(&metrics, "hot_tail_reads_total", "result=\"hit\"") >= 1, "{metrics}");
    assert_eq!(counter(&metrics, "hot_tail_reads_total", "result=\"miss\""), 0);
    assert!(counter(&metrics, "hot_tail_bytes", "") > 0);
    handle.shutdown().expect("clean shutdown");
}

/// The value of the one sample of `name` whose labels are exactly `labels`.
fn sample(text: &str, name: &str, labels: &str) -> Option<u64> {
    let prefix = format!("shardlog_{name}{{{labels}}} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).map(|v| v.parse().expect("number"))
}

#[test]
fn metrics_show_partition_logs_within_their_bound_fdatasyncs_and_the_probe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker_with(dir.path(), |c| {
        c.admin_listen = Some("127.0.0.1:0".parse().expect("addr"));
        c.metrics_partitions_max = 1;
        c.topic_defaults.flush = shardlog_broker::config::FlushPolicy::Always;
        c.topic_defaults.segment_bytes = 64 << 10;
    });
    let mut c = Conn::open(handle.ready.listen.port());
    assert_eq!(c.create_topic("m", 4), ErrorCode::None);
    for p in 0..4u32 {
        for i in 0..=p {
            let value = format!("{p}-{i}-{}", "m".repeat(30_000));
            assert_eq!(c.produce("m", p, &batch_of(&[&value])).0, ErrorCode::None);
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(50)); // a few probe wake-ups
    let metrics = scrape(handle.ready.admin.expect("admin"));
    // One partition per shard is shown (the first by name, internal topics
    // last), the rest counted: 4 of `m`, 16 of `__consumer_offsets`.
    let shown: Vec<u32> = (0..4u32)
        .filter(|p| {
            sample(&metrics, "partition_log_end_offset", &format!("topic=\"m\",partition=\"{p}\"")).is_some()
        })
        .collect();
    let omitted = counter(&metrics, "metrics_partitions_omitted", "");
    assert!((1..=2).contains(&shown.len()), "one per shard: {shown:?}\n{metrics}");
    assert_eq!(shown.len() as u64 + omitted, 4 + 16, "{metrics}");
    for p in shown {
        let labels = format!("topic=\"m\",partition=\"{p}\"");
        assert_eq!(sample(&metrics, "partition_log_end_offset", &labels), Some(u64::from(p) + 1));
        assert_eq!(sample(&metrics, "partition_log_start_offset", &labels), Some(0));
        assert!(sample(&metrics, "partition_log_size_bytes", &labels).expect("size") > 30_000 * u64::from(p));
        // Two 30 KB records fill a 64 KiB segment: partition 3 has rolled.
        let segments = sample(&metrics, "partition_log_segments", &labels).expect("segments");
        assert!(segments > u64::from(p) / 2, "partition {p}: {segments} segments");
    }
    // flush.policy=always: an fdatasync per acknowledged append at least.
    assert!(counter(&metrics, "log_fdatasync_duration_seconds_count", "") >= 10, "{metrics}");
    assert!(counter(&metrics, "shard_scheduling_delay_seconds_count", "") >= 2, "{metrics}");
    assert!(metrics.contains("# TYPE shardlog_shard_stalls_total counter"));
    // The latency breakdown counts every produced record once per stage
    // (10 records of 1 + 2 + 3 + 4 produces); the log's own stages count
    // what else it appended too.
    let stage = |s: &str| counter(&metrics, "stage_duration_seconds_count", &format!("stage=\"{s}\""));
    assert_eq!(stage("produce_in"), 10, "{metrics}");
    assert_eq!(stage("produce_out"), 10);
    assert!(stage("write_queue") >= 10 && stage("write") == stage("write_queue"));
    assert!(counter(&metrics, "log_writes_total", "") >= 10);
    assert!(counter(&metrics, "log_write_bytes_total", "") >= 10 * 30_000);
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn shutdown_closes_open_connections() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker_with(dir.path(), |_| {});
    let mut idle = Conn::open(handle.ready.listen.port());
    assert_eq!(idle.create_topic("bye", 1), ErrorCode::None);
    handle.shutdown().expect("clean shutdown");
    let mut buf = [0u8; 16];
    // The peer sees the end of the stream, not a hang until its timeout.
    match idle.stream.read(&mut buf) {
        Ok(n) => assert_eq!(n, 0, "expected end of stream"),
        Err(e) => assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "connection left open: {e}"),
    }
}

/// Partition directories of `topic` under the data directory.
fn partition_dirs(dir: &std::path::Path, topic: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list data dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.strip_prefix(topic).is_some_and(|rest| rest.starts_with('-')))
        .collect();
    names.sort();
    names
}

#[test]
fn failed_topic_creation_leaves_no_partition_directories() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), 2);
    let mut c = Conn::open(handle.ready.listen.port());
    // Partition 5 cannot open: its metadata file is a directory. Every other
    // partition, on both shards, opens first or is never opened.
    std::fs::create_dir_all(dir.path().join("doomed-5/partition.metadata")).expect("blocker");
    let err = c.create_topic("doomed", 8);
    assert_eq!(err, ErrorCode::StorageError);
    assert_eq!(
        partition_dirs(dir.path(), "doomed"),
        Vec::<String>::new(),
        "rollback removes every directory"
    );
    // The name is free again and the broker serves it.
    assert_eq!(c.create_topic("doomed", 8), ErrorCode::None);
    assert_eq!(partition_dirs(dir.path(), "doomed").len(), 8);
    assert_eq!(c.produce("doomed", 5, &batch_of(&["x"])), (ErrorCode::None, 0));
    handle.shutdown().expect("clean shutdown");
}

#[test]
fn topic_creations_and_deletions_survive_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let handle = broker(dir.path(), 2);
    let mut c = Conn::open(handle.ready.listen.port());
    for name in ["kept", "dropped", "recreated"] {
        assert_eq!(c.create_topic(name, 3), ErrorCode::None);
    }
    assert_eq!(c.produce("kept", 1, &batch_of(&["k"])), (ErrorCode::None, 0));
    assert_eq!(c.delete_topic("dropped"), ErrorCode::None);
    assert_eq!(c.delete_topic("dropped"), ErrorCode::UnknownTopicOrPartition);
    assert_eq!(c.delete_topic("recreated"), ErrorCode::None);
    assert_eq!(c.create_topic("recreated", 2), ErrorCode::None);
    handle.shutdown().expect("clean shutdown");
    assert!(!dir.path().join("topics.json.tmp").exists(), "the temp file was renamed away");

    let handle = broker(dir.path(), 2);
    let mut c = Conn::open(handle.ready.listen.port());
    let (err, data, hw) = c.fetch("kept", 1, 0, 0);
    assert_eq!((err, hw), (ErrorCode::None, 1));
    assert_eq!(values(&data), vec![(0, b"k".to_vec())]);
    assert_eq!(c.fetch("dropped", 0, 0, 0).0, ErrorCode::UnknownTopicOrPartition);
    assert_eq!(partition_dirs(dir.path(), "dropped"), Vec::<String>::new());
    // Recreated with 2 partitions: the second creation is what was stored.
    assert_eq!(c.fetch("recreated", 1, 0, 0).0, ErrorCode::None);
    assert_eq!(c.fetch("recreated", 2, 0, 0).0, ErrorCode::UnknownTopicOrPartition);
    assert_eq!(c.create_topic("kept", 3), ErrorCode::TopicAlreadyExists);
    handle.shutdown().expect("clean shutdown");
}
