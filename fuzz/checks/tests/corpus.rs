//! The fuzz targets' checks in the normal test run, on stable Rust: every
//! file of `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/` goes
//! through `shardlog_fuzz_checks::<target>` (fuzz/README.md). Also builds
//! the seed inputs (real frames, batches, segments, index files, the
//! example settings file), checks that the checks accept them as valid, and
//! with `--ignored` writes them into `fuzz/corpus/` to start a corpus.

use flatbuffers::{FlatBufferBuilder, UnionWIPOffset, WIPOffset};
use shardlog_broker::log::index::{self, ScanStop};
use shardlog_client::protocol as client;
use shardlog_fuzz_checks::{self as checks, TARGETS};
use shardlog_schema::batch::{self, BatchBuilder};
use shardlog_schema::frame::{self, FrameLimits};
use shardlog_schema::wire;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("fuzz/").to_path_buf()
}

fn files_of(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    files.sort();
    files
}

#[test]
fn corpus_and_regressions_pass_their_checks() {
    let mut failed = Vec::new();
    let mut counts = BTreeMap::new();
    for (target, check) in TARGETS {
        for kind in ["corpus", "regressions"] {
            for path in files_of(&fuzz_dir().join(kind).join(target)) {
                let data = std::fs::read(&path).expect("readable");
                if std::panic::catch_unwind(|| check(&data)).is_err() {
                    failed.push(path.display().to_string());
                }
                *counts.entry((*target, kind)).or_insert(0usize) += 1;
            }
        }
        assert!(counts.contains_key(&(*target, "corpus")), "fuzz/corpus/{target}/ is empty or missing");
    }
    eprintln!("replayed: {counts:?}");
    assert!(failed.is_empty(), "inputs that fail their check (see the panics above): {failed:#?}");
}

/// Every version of every API the Kafka listener lists decodes its default
/// request: no API it lists lacks a decoder.
#[test]
fn every_supported_kafka_request_decodes() {
    for &(api, min, max) in shardlog_broker::kafka::SUPPORTED {
        for v in min..=max {
            let frame = bytes::Bytes::from(kafka_request_seed(api, v));
            let (got, version, _, _) = shardlog_broker::kafka::request::decode_frame(frame)
                .unwrap_or_else(|e| panic!("{api:?} v{v}: {e}"));
            assert_eq!((got, version), (api, v));
        }
    }
}

/// The seeds pass their checks and are what their decoder accepts.
#[test]
fn seeds_are_valid_inputs() {
    let seeds = seeds();
    for (target, check) in TARGETS {
        assert!(seeds.iter().any(|s| s.0 == *target), "no seed for {target}");
        for (_, name, data) in seeds.iter().filter(|s| s.0 == *target) {
            check(data);
            let valid = match *target {
                "frame" => {
                    let len = frame::decode_prefix(data[..4].try_into().expect("4")) as usize;
                    let l = FrameLimits::default();
                    l.verify_request(&data[4..4 + len]).is_ok()
                        || l.verify_response(&data[4..4 + len]).is_ok()
                }
                "batch" => batch::validate_with_records(&data[2..], 1 << 20).is_ok(),
                "recovery_scan" => {
                    let s = index::scan_bytes(&data[15..], 0, 256, None, 0);
                    s.batches > 0 && (s.stop == ScanStop::Clean || !name.contains("segment"))
                }
                "index" => {
                    let file = &data[9..];
                    name.contains("timeindex")
                        || index::decode_trailer(
                            &file[file.len() - index::TRAILER_BYTES..],
                            file.len() as u64,
                        )
                        .is_some()
                }
                "settings_toml" => {
                    toml::from_str::<checks::settings::Settings>(std::str::from_utf8(data).expect("utf-8"))
                        .is_ok()
                }
                "kafka_request" => {
                    shardlog_broker::kafka::request::decode_frame(bytes::Bytes::copy_from_slice(data)).is_ok()
                }
                "kafka_records" => shardlog_broker::kafka::records::kafka_to_native(
                    bytes::Bytes::copy_from_slice(&data[1..]),
                    &mut Vec::new(),
                    shardlog_broker::config::BATCH_BYTES_MAX_DEFAULT as usize,
                )
                .is_ok(),
                _ => true,
            };
            assert!(valid, "seed {target}/{name} is not a valid input");
        }
    }
}

/// Writes the seeds into `fuzz/corpus/<target>/seed-<name>`:
/// `cargo test -p shardlog-fuzz-checks --test corpus -- --ignored`.
#[test]
#[ignore = "writes files; run by hand to (re)start the corpus"]
fn write_seeds() {
    for (target, name, data) in seeds() {
        let dir = fuzz_dir().join("corpus").join(target);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join(format!("seed-{name}")), data).expect("write");
    }
}

type BodyFn = fn(&mut FlatBufferBuilder<'static>) -> WIPOffset<UnionWIPOffset>;

fn empty_table(fbb: &mut FlatBufferBuilder<'static>) -> WIPOffset<UnionWIPOffset> {
    let start = fbb.start_table();
    fbb.end_table(start).as_union_value()
}

fn metadata_body(fbb: &mut FlatBufferBuilder<'static>) -> WIPOffset<UnionWIPOffset> {
    let names = [fbb.create_string("orders"), fbb.create_string("payments")];
    let topics = fbb.create_vector(&names);
    wire::MetadataRequest::create(fbb, &wire::MetadataRequestArgs { topics: Some(topics) }).as_union_value()
}

fn produce_body(fbb: &mut FlatBufferBuilder<'static>) -> WIPOffset<UnionWIPOffset> {
    let topic = fbb.create_string("orders");
    let p = wire::ProducePartitionData::create(
        fbb,
        &wire::ProducePartitionDataArgs { topic: Some(topic), partition: 3, batch_bytes: 120 },
    );
    let partitions = fbb.create_vector(&[p]);
    wire::ProduceRequest::create(
        fbb,
        &wire::ProduceRequestArgs { acks: -1, timeout_ms: 5000, partitions: Some(partitions) },
    )
    .as_union_value()
}

fn fetch_body(fbb: &mut FlatBufferBuilder<'static>) -> WIPOffset<UnionWIPOffset> {
    let topic = fbb.create_string("orders");
    let p = wire::FetchPartition::create(
        fbb,
        &wire::FetchPartitionArgs {
            topic: Some(topic),
            partition: 1,
            fetch_offset: 42,
            partition_max_bytes: 1 << 20,
            current_leader_epoch: -1,
            replica_log_end: -1,
        },
    );
    let partitions = fbb.create_vector(&[p]);
    wire::FetchRequest::create(
        fbb,
        &wire::FetchRequestArgs {
            replica_id: -1,
            max_wait_ms: 500,
            min_bytes: 1,
            max_bytes: 1 << 24,
            partitions: Some(partitions),
        },
    )
    .as_union_value()
}

fn join_group_body(fbb: &mut FlatBufferBuilder<'static>) -> WIPOffset<UnionWIPOffset> {
    let group_id = Some(fbb.create_string("billing"));
    let member_id = Some(fbb.create_string(""));
    let protocol_type = Some(fbb.create_string("consumer"));
    let name = Some(fbb.create_string("range"));
    let metadata = Some(fbb.create_vector(&[0u8, 1, 0, 0, 0, 1, 0, 6, b'o', b'r', b'd', b'e', b'r', b's']));
    let protocol = wire::GroupProtocol::create(fbb, &wire::GroupProtocolArgs { name, metadata });
    let protocols = Some(fbb.create_vector(&[protocol]));
    wire::JoinGroupRequest::create(
        fbb,
        &wire::JoinGroupRequestArgs {
            group_id,
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            member_id,
            group_instance_id: None,
            protocol_type,
            protocols,
            reason: None,
        },
    )
    .as_union_value()
}

/// (union index from 0, name, body builder) of the bodies with fields.
const BODIES: &[(u8, &str, BodyFn)] = &[
    (1, "metadata", metadata_body),
    (4, "produce", produce_body),
    (5, "fetch", fetch_body),
    (8, "join_group", join_group_body),
];

fn request_frame(key: u16, body_index: u8, body: BodyFn) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let body = body(&mut fbb);
    let client_id = fbb.create_string("seed");
    let root = wire::RequestFrame::create(
        &mut fbb,
        &wire::RequestFrameArgs {
            correlation_id: 7,
            api_key: wire::ApiKey(key),
            api_version: 0,
            client_id: Some(client_id),
            payload_bytes: if key == wire::ApiKey::Produce.0 { 120 } else { 0 },
            body_type: wire::RequestBody(body_index + 1),
            body: Some(body),
        },
    );
    let mut out = Vec::new();
    frame::finish_into(&mut fbb, root, &mut out);
    out
}

fn real_batch(records: u8, base: u64, ts: i64) -> Vec<u8> {
    let mut b = BatchBuilder::with_capacity(512);
    for i in 0..records {
        if i == 2 {
            b.push_tombstone(b"gone", &[], ts + i64::from(i));
        } else {
            b.push(Some(&[b'k', i]), format!("value {i}").as_bytes(), &[("trace", &[i])], ts + i64::from(i));
        }
    }
    let mut batch = b.finish();
    batch::stamp(&mut batch, base, 3);
    batch
}

fn segment(batches: u8) -> Vec<u8> {
    let mut seg = Vec::new();
    let mut next = 0;
    for i in 0..batches {
        let n = 1 + i % 4;
        seg.extend_from_slice(&real_batch(n, next, 1_700_000_000_000 + i64::from(i) * 10));
        next += u64::from(n);
    }
    seg
}

/// The recovery target's parameter bytes: flags, base, interval,
/// stop-at, gaps-below.
fn scan_params(flags: u8, base: u32, interval: u16) -> Vec<u8> {
    let mut p = vec![flags];
    p.extend_from_slice(&base.to_le_bytes());
    p.extend_from_slice(&interval.to_le_bytes());
    p.extend_from_slice(&5u32.to_le_bytes());
    p.extend_from_slice(&0u32.to_le_bytes());
    p
}

/// (target, name, bytes) of every seed.
/// A default `api` request at `version`, as a Kafka client frames it (the
/// request header, then the body; no length prefix).
fn kafka_request_seed(api: kafka_protocol::messages::ApiKey, version: i16) -> Vec<u8> {
    use kafka_protocol::messages::*;
    use kafka_protocol::protocol::Encodable;
    fn encode<T: Encodable + Default>(api: ApiKey, version: i16) -> Vec<u8> {
        let mut header = RequestHeader::default();
        header.request_api_key = api as i16;
        header.request_api_version = version;
        header.correlation_id = 1;
        header.client_id = Some(kafka_protocol::protocol::StrBytes::from_static_str("seed"));
        let mut out = bytes::BytesMut::new();
        header.encode(&mut out, api.request_header_version(version)).expect("a header encodes");
        T::default().encode(&mut out, version).expect("a default request encodes");
        out.to_vec()
    }
    match api {
        ApiKey::ApiVersions => encode::<ApiVersionsRequest>(api, version),
        ApiKey::Metadata => encode::<MetadataRequest>(api, version),
        ApiKey::Produce => encode::<ProduceRequest>(api, version),
        ApiKey::Fetch => encode::<FetchRequest>(api, version),
        ApiKey::ListOffsets => encode::<ListOffsetsRequest>(api, version),
        ApiKey::CreateTopics => encode::<CreateTopicsRequest>(api, version),
        ApiKey::DeleteTopics => encode::<DeleteTopicsRequest>(api, version),
        ApiKey::DescribeConfigs => encode::<DescribeConfigsRequest>(api, version),
        ApiKey::InitProducerId => encode::<InitProducerIdRequest>(api, version),
        ApiKey::FindCoordinator => encode::<FindCoordinatorRequest>(api, version),
        ApiKey::JoinGroup => encode::<JoinGroupRequest>(api, version),
        ApiKey::SyncGroup => encode::<SyncGroupRequest>(api, version),
        ApiKey::Heartbeat => encode::<HeartbeatRequest>(api, version),
        ApiKey::LeaveGroup => encode::<LeaveGroupRequest>(api, version),
        ApiKey::OffsetCommit => encode::<OffsetCommitRequest>(api, version),
        ApiKey::OffsetFetch => encode::<OffsetFetchRequest>(api, version),
        ApiKey::ListGroups => encode::<ListGroupsRequest>(api, version),
        ApiKey::DescribeGroups => encode::<DescribeGroupsRequest>(api, version),
        ApiKey::DeleteGroups => encode::<DeleteGroupsRequest>(api, version),
        other => panic!("{other:?} is supported but has no seed here"),
    }
}

fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut s: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    // kafka_request: every supported API at its lowest and highest version
    // (every version decodes: the seeds test checks them all).
    for &(api, min, max) in shardlog_broker::kafka::SUPPORTED {
        for v in [min, max] {
            s.push(("kafka_request", format!("{api:?}-v{v}"), kafka_request_seed(api, v)));
        }
    }
    // frame: what the client sends, an envelope per API, an error response.
    s.push(("frame", "metadata".into(), client::encode_metadata(1, "cli", Some(&["orders".to_string()]))));
    let topic = client::NewTopic {
        name: "orders".into(),
        partitions: 4,
        replication_factor: 1,
        configs: vec![("retention.ms".into(), "1000".into())],
    };
    s.push(("frame", "create_topics".into(), client::encode_create_topics(2, "cli", &[topic])));
    s.push(("frame", "delete_topics".into(), client::encode_delete_topics(3, "cli", &["orders".into()])));
    let entry = client::ProduceEntry { topic: "orders", partition: 0, batch_bytes: 200 };
    s.push(("frame", "produce".into(), client::encode_produce(4, "cli", 1, 30_000, &[entry])));
    let params = client::FetchParams { max_wait_ms: 500, min_bytes: 1, max_bytes: 1 << 20 };
    let target = client::FetchTarget { topic: "orders".into(), partition: 0, offset: 5, max_bytes: 1 << 20 };
    s.push(("frame", "fetch".into(), client::encode_fetch(5, "cli", params, &[target])));
    let query = client::OffsetQuery { topic: "orders".into(), partition: 0, timestamp: -1 };
    s.push(("frame", "list_offsets".into(), client::encode_list_offsets(6, "cli", &[query])));
    for i in 0..checks::REQUEST_BODIES {
        s.push(("frame", format!("empty-body-{i}"), request_frame(u16::from(i), i, empty_table)));
    }
    for (i, name, body) in BODIES {
        s.push(("frame", format!("body-{name}"), request_frame(u16::from(*i), *i, *body)));
    }
    let mut err = Vec::new();
    frame::error_response(9, wire::ApiKey::Fetch, wire::ErrorCode::CorruptMessage, "bad", &mut err);
    s.push(("frame", "error_response".into(), err));
    // request_body: each table alone, empty, and some with fields.
    for i in 0..checks::REQUEST_BODIES {
        let mut fbb = FlatBufferBuilder::new();
        let t = empty_table(&mut fbb);
        fbb.finish_minimal(t);
        s.push(("request_body", format!("empty-{i}"), [&[i][..], fbb.finished_data()].concat()));
    }
    for (i, name, body) in BODIES {
        let mut fbb = FlatBufferBuilder::new();
        let t = body(&mut fbb);
        fbb.finish_minimal(t);
        s.push(("request_body", (*name).into(), [&[*i][..], fbb.finished_data()].concat()));
    }
    // batch: flags 0, limit choice 0 (1 MiB), a real batch.
    for (name, records, base) in [("one", 1, 0), ("five", 5, 1000), ("high-base", 3, (i64::MAX - 10) as u64)]
    {
        s.push((
            "batch",
            name.into(),
            [&[0u8, 0][..], &real_batch(records, base, 1_700_000_000_000)].concat(),
        ));
    }
    let mut idem = BatchBuilder::with_capacity(256);
    idem.set_producer(77, 2, 100);
    idem.set_attributes(batch::ATTR_TIMESTAMP_LOG_APPEND);
    idem.push(None, b"x", &[], 5);
    idem.push(Some(b"k"), b"y", &[], 4);
    s.push(("batch", "idempotent".into(), [&[0u8, 0][..], &idem.finish()].concat()));
    // recovery_scan: a segment of real batches, whole, with a zero tail,
    // torn, and with a small index interval.
    let seg = segment(12);
    s.push(("recovery_scan", "segment".into(), [scan_params(0, 0, 256), seg.clone()].concat()));
    let zeros = [seg.clone(), vec![0u8; 300]].concat();
    s.push(("recovery_scan", "zero-tail".into(), [scan_params(0, 0, 256), zeros].concat()));
    let torn = seg[..seg.len() - 17].to_vec();
    s.push(("recovery_scan", "torn".into(), [scan_params(0, 0, 256), torn].concat()));
    s.push(("recovery_scan", "stop-at".into(), [scan_params(4, 0, 1), seg.clone()].concat()));
    // index: the index files recovery rebuilds for that segment.
    let scan = index::scan_bytes(&seg, 0, 256, None, 0);
    let summary = scan.index.summary(seg.len() as u64, scan.next_offset);
    let ix = index::encode_index(&scan.index.entries, &summary);
    let tx = index::encode_time_index(&scan.index.times);
    let probe = 9u64.to_le_bytes();
    s.push(("index", "index".into(), [&[0u8][..], &probe, &ix].concat()));
    s.push(("index", "timeindex".into(), [&[0u8][..], &probe, &tx].concat()));
    let empty = index::encode_index(&[], &index::IndexBuilder::new(4096).summary(0, 0));
    s.push(("index", "empty-index".into(), [&[0u8][..], &probe, &empty].concat()));
    // settings_toml: the repository's example file, and the module's own.
    let example = std::fs::read(fuzz_dir().join("../shardlog.example.toml")).expect("shardlog.example.toml");
    s.push(("settings_toml", "shardlog.example.toml".into(), example));
    let short = "bootstrap = \"127.0.0.1:9092\"\n[serve]\nshards = 4\n[serve.topic_defaults]\n\"retention.ms\" = \"86400000\"\n[producer]\nacks = \"leader\"\n";
    s.push(("settings_toml", "short".into(), short.as_bytes().to_vec()));
    // topic_config: settings as `topic create --config` takes them.
    let lines = "retention.ms=86400000\nsegment.bytes=1048576\ncleanup.policy=compact,delete\nmin.cleanable.dirty.ratio=0.25\nflush.policy=always\nmax.message.bytes=1000000\n";
    s.push(("topic_config", "many".into(), lines.as_bytes().to_vec()));
    let entries = shardlog_broker::config::TopicConfig::default().entries();
    let defaults: String = entries.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
    s.push(("topic_config", "defaults".into(), defaults.into_bytes()));
    // kafka_records: real batches in Kafka's format (translated from ours).
    let mut kafka = bytes::BytesMut::new();
    let two = [real_batch(3, 0, 1_700_000_000_000), real_batch(1, 3, 1_700_000_000_100)].concat();
    shardlog_broker::kafka::records::native_to_kafka(&two, 1 << 20, &mut kafka).expect("translates");
    s.push(("kafka_records", "two-batches".into(), [&[0u8][..], &kafka].concat()));
    s
}
