//! Idempotent producing through the Kafka listener: kafka-python (whose
//! default is `enable_idempotence=True`) and confluent-kafka with
//! `enable.idempotence=true` as real processes, and exact retries, gaps and
//! stale epochs sent with the `kafka-protocol` crate's client encoders (as
//! is a decompression bomb, refused before it inflates).

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
mod common;

use bytes::{Bytes, BytesMut};
use common::{have, start_kafka as start};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

/// One request/response exchange on `s`.
fn exchange<Req, Resp>(s: &mut TcpStream, key: ApiKey, version: i16, req: &Req) -> Resp
where
    Req: Encodable + HeaderVersion,
    Resp: Decodable + HeaderVersion,
{
    let mut header = RequestHeader::default();
    header.request_api_key = key as i16;
    header.request_api_version = version;
    header.correlation_id = 11;
    header.client_id = Some(StrBytes::from_static_str("idempotence-test"));
    let mut body = BytesMut::new();
    header.encode(&mut body, Req::header_version(version)).expect("header encodes");
    req.encode(&mut body, version).expect("request encodes");
    s.write_all(&(body.len() as i32).to_be_bytes()).expect("send");
    s.write_all(&body).expect("send");
    let mut len = [0u8; 4];
    s.read_exact(&mut len).expect("an answer");
    let mut resp = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut resp).expect("the whole answer");
    let mut resp = Bytes::from(resp);
    let h = ResponseHeader::decode(&mut resp, Resp::header_version(version)).expect("response header");
    assert_eq!(h.correlation_id, 11);
    Resp::decode(&mut resp, version).expect("response decodes")
}

/// A Kafka v2 batch of `n` records from `pid`/`epoch` starting at `seq`.
fn batch(pid: i64, epoch: i16, seq: i32, n: usize) -> Bytes {
    let values = (0..n).map(|i| Bytes::from(format!("s{}", seq as usize + i))).collect();
    encode_batch(pid, epoch, seq, values, Compression::None)
}

fn encode_batch(pid: i64, epoch: i16, seq: i32, values: Vec<Bytes>, compression: Compression) -> Bytes {
    let records: Vec<Record> = values
        .into_iter()
        .enumerate()
        .map(|(i, value)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: pid,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: seq + i as i32,
            timestamp: 1_700_000_000_000 + i as i64,
            key: None,
            value: Some(value),
            headers: Default::default(),
        })
        .collect();
    let mut out = BytesMut::new();
    let options = RecordEncodeOptions { version: 2, compression };
    RecordBatchEncoder::encode(&mut out, &records, &options).expect("batch encodes");
    out.freeze()
}

/// Produces one batch to `t`/0 with acks=all; (error code, base offset).
fn produce(s: &mut TcpStream, records: Bytes) -> (i16, i64) {
    let mut part = produce_request::PartitionProduceData::default();
    part.index = 0;
    part.records = Some(records);
    let mut topic = produce_request::TopicProduceData::default();
    topic.name = TopicName(StrBytes::from_static_str("t"));
    topic.partition_data.push(part);
    let mut req = ProduceRequest::default();
    req.acks = -1;
    req.timeout_ms = 10_000;
    req.topic_data.push(topic);
    let resp: ProduceResponse = exchange(s, ApiKey::Produce, 7, &req);
    let p = &resp.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

fn init_producer_id(s: &mut TcpStream, id: i64, epoch: i16) -> InitProducerIdResponse {
    let mut req = InitProducerIdRequest::default();
    req.transactional_id = None;
    req.transaction_timeout_ms = 60_000;
    req.producer_id = ProducerId(id);
    req.producer_epoch = epoch;
    exchange(s, ApiKey::InitProducerId, 4, &req)
}

#[test]
fn retries_are_stored_once_and_gaps_and_fenced_epochs_get_kafka_s_errors() {
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "1"], "");
    let mut s = TcpStream::connect(&kafka).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");

    let first = init_producer_id(&mut s, -1, -1);
    assert_eq!(first.error_code, 0);
    assert!(first.producer_id.0 >= 0 && first.producer_epoch == 0, "{first:?}");
    let other = init_producer_id(&mut s, -1, -1);
    assert_ne!(other.producer_id.0, first.producer_id.0, "every producer gets its own id");
    let pid = first.producer_id.0;

    assert_eq!(produce(&mut s, batch(pid, 0, 0, 3)), (0, 0));
    assert_eq!(produce(&mut s, batch(pid, 0, 3, 2)), (0, 3));
    // The client lost the answers and retries both: same offsets, not stored again.
    assert_eq!(produce(&mut s, batch(pid, 0, 0, 3)), (0, 0));
    assert_eq!(produce(&mut s, batch(pid, 0, 3, 2)), (0, 3));
    // A gap: OUT_OF_ORDER_SEQUENCE_NUMBER (45).
    assert_eq!(produce(&mut s, batch(pid, 0, 9, 1)).0, 45);
    // KIP-360: the producer bumps its epoch; the old epoch is fenced (47).
    let bumped = init_producer_id(&mut s, pid, 0);
    assert_eq!((bumped.error_code, bumped.producer_id.0, bumped.producer_epoch), (0, pid, 1));
    assert_eq!(produce(&mut s, batch(pid, 1, 0, 2)), (0, 5));
    assert_eq!(produce(&mut s, batch(pid, 0, 5, 1)).0, 47, "INVALID_PRODUCER_EPOCH");
    // A transactional id is refused: transactions are not supported.
    let mut txn = InitProducerIdRequest::default();
    txn.transactional_id = Some(TransactionalId(StrBytes::from_static_str("tx")));
    txn.producer_id = ProducerId(-1);
    txn.producer_epoch = -1;
    let refused: InitProducerIdResponse = exchange(&mut s, ApiKey::InitProducerId, 4, &txn);
    assert_ne!(refused.error_code, 0);

    // The log holds 3 + 2 + 2 records, each once.
    let out = broker.ok(&["consume", "t", "--from-beginning", "--max-messages", "7"], "");
    assert_eq!(out.lines().collect::<Vec<_>>(), ["s0", "s1", "s2", "s3", "s4", "s0", "s1"], "{out}");
    drop(s);

    // After a crash (SIGKILL) and restart, a retry of the last batch is
    // still a duplicate.
    let mut broker = broker;
    broker.kill_and_restart();
    let kafka = broker.kafka.clone().expect("kafka listener");
    let mut s = TcpStream::connect(&kafka).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    assert_eq!(produce(&mut s, batch(pid, 1, 0, 2)), (0, 5), "remembered across a restart");
    let after = init_producer_id(&mut s, -1, -1);
    assert!(after.producer_id.0 > other.producer_id.0, "ids are never handed out twice: {after:?}");
}

#[test]
fn a_decompression_bomb_is_refused_as_too_large_and_the_partition_goes_on() {
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "1"], "");
    let mut s = TcpStream::connect(&kafka).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    // 64 MiB of zeros gzip to ~64 KB; the topic takes batches up to 16 MiB.
    let bomb = encode_batch(-1, -1, -1, vec![Bytes::from(vec![0u8; 64 << 20])], Compression::Gzip);
    assert!(bomb.len() < 1 << 20, "the bomb is small on the wire: {}", bomb.len());
    assert_eq!(produce(&mut s, bomb).0, 10, "MESSAGE_TOO_LARGE");
    // The same connection and partition go on.
    let ok = encode_batch(-1, -1, -1, vec![Bytes::from_static(b"fine")], Compression::Gzip);
    assert_eq!(produce(&mut s, ok), (0, 0));
    assert_eq!(broker.ok(&["consume", "t", "--from-beginning", "--max-messages", "1"], "").trim(), "fine");
}

const IDEMPOTENT_CLIENTS: &str = r#"
import sys
kafka, which = sys.argv[1], sys.argv[2]
N = 600
if which == "confluent":
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": kafka, "enable.idempotence": True, "linger.ms": 2})
    for i in range(N):
        p.produce("t", key=b"k%d" % (i % 5), value=b"%d" % i)
        if i % 100 == 0:
            p.poll(0)
    assert p.flush(30) == 0, "undelivered records"
else:
    from kafka import KafkaProducer
    # kafka-python 3 enables idempotence by default: no option given.
    p = KafkaProducer(bootstrap_servers=kafka, linger_ms=2)
    fs = [p.send("t", key=b"k%d" % (i % 5), value=b"%d" % i) for i in range(N)]
    p.flush(30)
    [f.get(timeout=30) for f in fs]
print(N)
"#;

fn idempotent_client(which: &str, module: &str) {
    if !have("python3", &["-c", &format!("import {module}")]) {
        return;
    }
    let (broker, kafka) = start();
    broker.ok(&["topic", "create", "t", "--partitions", "3"], "");
    let out =
        Command::new("python3").args(["-c", IDEMPOTENT_CLIENTS, &kafka, which]).output().expect("python3");
    assert!(out.status.success(), "{which}: {}", String::from_utf8_lossy(&out.stderr));
    // Every record once, in send order per key.
    let got =
        broker.ok(&["consume", "t", "--from-beginning", "--max-messages", "600", "--format", "json"], "");
    let mut values: Vec<u64> = Vec::new();
    let mut by_partition: std::collections::BTreeMap<i64, Vec<u64>> = Default::default();
    for line in got.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json line");
        let value: u64 = v["value"].as_str().expect("value").parse().expect("number");
        values.push(value);
        by_partition.entry(v["partition"].as_i64().expect("partition")).or_default().push(value);
    }
    values.sort_unstable();
    assert_eq!(values, (0..600).collect::<Vec<_>>(), "{which}: each record exactly once");
    for (p, vs) in by_partition {
        assert!(vs.windows(2).all(|w| w[0] < w[1]), "{which}: partition {p} out of order: {vs:?}");
    }
    // The batches carry the producer id the broker handed out.
    let segment = broker.dir.path().join("t-0").join(format!("{:020}.log", 0));
    let dump = broker.ok(&["log", "dump", &segment.to_string_lossy()], "");
    assert!(
        dump.contains("producerId: ") && !dump.contains("producerId: -1 "),
        "{which}: stored batches are idempotent: {dump}"
    );
}

#[test]
fn confluent_kafka_produces_idempotently() {
    idempotent_client("confluent", "confluent_kafka");
}

#[test]
fn kafka_python_produces_idempotently_by_default() {
    idempotent_client("kafka-python", "kafka");
}
