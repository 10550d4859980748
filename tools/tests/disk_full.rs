//! Disk full end to end (issue 15). A real `shardlog serve` runs with its
//! data directory on a small loop-mounted ext4 filesystem; a filler file
//! (fallocate) leaves it 2 MiB, which records fill, then takes the rest.
//! Proves that:
//! 1. producers get the typed storage error when the disk fills (the log's
//!    `LogError::NoSpace`, wire code `StorageFull`, "no space left on
//!    device"): the Rust `Producer` as a non-retriable
//!    `ClientError::Broker { code: StorageFull, .. }`, `shardlog produce`
//!    on stderr with a failure exit; the broker keeps running, no log is
//!    failed (poisoned), and each partition holds exactly the acknowledged
//!    records, none lost;
//! 2. consumers read every acknowledged record while the disk is full;
//! 3. once the filler is deleted, producing resumes with no broker restart
//!    (the same long-lived producer, and a new one), and every record
//!    acknowledged before, during and after is in the log at its
//!    acknowledged offset, in send order, with nothing else (also after a
//!    SIGKILL and restart).
//!
//! Run twice, in parallel on two filesystems: with a producer without
//! idempotence (the broker's side alone) and with the producer's default,
//! idempotence (whose later batches must not be refused for the failed
//! one's sequence numbers). Needs root and a loop device (as here and in
//! CI): says SKIPPED otherwise.

#[allow(dead_code, reason = "each test binary uses part of the shared helpers")]
mod common;

use common::{lines_of, serve_command, signal_and_wait, wait_ready, Broker};
use shardlog_client::{Acks, ClientConfig, ClientError, Producer, ProducerConfig, ProducerRecord};
use shardlog_schema::ErrorCode;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const TOPIC: &str = "full";
const PARTITIONS: u32 = 2;
/// Small segments, so rolls (a new file, sealed indexes) come often; the
/// active segment is preallocated up to this.
const SEGMENT_BYTES: u64 = 256 << 10;
const FS_BYTES: u64 = 96 << 20;
/// What the filler leaves free at first, for records to fill.
const LEAVE_BYTES: u64 = 2 << 20;
const VALUE_BYTES: usize = 1000;
/// Once space is back, producing must resume within this.
const RESUME_WITHIN: Duration = Duration::from_secs(10);

/// Runs `cmd`; its stdout, or what went wrong.
fn tool(cmd: &mut Command) -> Result<String, String> {
    match cmd.stdin(Stdio::null()).output() {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Ok(out) => Err(format!("{cmd:?}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())),
        Err(e) => Err(format!("{cmd:?}: {e}")),
    }
}

/// An ext4 image in a temp directory, attached to a loop device and mounted
/// at `mnt`. Dropping it unmounts and detaches (after the broker is gone:
/// declare it before the broker, so it drops after, panics included).
struct LoopFs {
    mnt: PathBuf,
    dev: String,
    fillers: Vec<PathBuf>,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    /// `None` (after saying SKIPPED) where it cannot be set up: not root, no
    /// loop device, no mkfs.ext4.
    fn mount(bytes: u64) -> Option<LoopFs> {
        let skip = |why: String| eprintln!("SKIPPED: cannot loop-mount a small ext4 filesystem: {why}");
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("fs.img");
        std::fs::File::create(&img).and_then(|f| f.set_len(bytes)).expect("image file");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        if let Err(e) = tool(Command::new("fallocate").arg("--version")) {
            skip(e);
            return None;
        }
        // No blocks reserved for root: the broker runs as root here.
        if let Err(e) = tool(Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0", "-b", "4096"]).arg(&img))
        {
            skip(e);
            return None;
        }
        let dev = match tool(Command::new("losetup").args(["--find", "--show"]).arg(&img)) {
            Ok(out) => out.trim().to_string(),
            Err(e) => {
                skip(e);
                return None;
            }
        };
        if let Err(e) = tool(Command::new("mount").arg(&dev).arg(&mnt)) {
            let _ = tool(Command::new("losetup").arg("-d").arg(&dev));
            skip(e);
            return None;
        }
        Some(LoopFs { mnt, dev, fillers: Vec::new(), _dir: dir })
    }

    /// Bytes free for an unprivileged writer (`df`).
    fn avail(&self) -> u64 {
        let out = tool(Command::new("df").args(["--output=avail", "-B1"]).arg(&self.mnt)).expect("df");
        out.lines().nth(1).and_then(|l| l.trim().parse().ok()).unwrap_or_else(|| panic!("df said {out:?}"))
    }

    /// Fallocates filler files until at most `leave` bytes (and a block)
    /// are free.
    fn fill_leaving(&mut self, leave: u64) {
        let mut len = u64::MAX;
        loop {
            let avail = self.avail();
            if avail <= leave + 4096 || len < 4096 {
                return;
            }
            len = len.min(avail - leave);
            let path = self.mnt.join(format!("filler-{}", self.fillers.len()));
            match tool(Command::new("fallocate").arg("-l").arg(len.to_string()).arg(&path)) {
                Ok(_) => self.fillers.push(path),
                Err(_) => {
                    // Extent blocks take some of it: ask for less.
                    let _ = std::fs::remove_file(&path);
                    len /= 2;
                }
            }
        }
    }

    /// Deletes the fillers and commits the journal, so their blocks are free.
    fn free(&mut self) {
        for path in self.fillers.drain(..) {
            std::fs::remove_file(&path).expect("remove filler");
        }
        tool(Command::new("sync").arg("-f").arg(&self.mnt)).expect("sync -f");
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        // A just-killed broker's files may take a moment to close (its
        // io_uring rings are torn down after the process).
        let mut last = String::new();
        for _ in 0..50 {
            match tool(Command::new("umount").arg(&self.mnt)) {
                Ok(_) => {
                    last.clear();
                    break;
                }
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if !last.is_empty() {
            eprintln!("disk full: {last}; unmounting lazily");
            let _ = tool(Command::new("umount").arg("-l").arg(&self.mnt));
        }
        if let Err(e) = tool(Command::new("losetup").arg("-d").arg(&self.dev)) {
            eprintln!("disk full: cannot detach {}: {e}", self.dev);
        }
    }
}

/// The broker's stderr, echoed as it is read, and checks on it.
struct BrokerLog {
    name: String,
    rx: Receiver<String>,
    lines: Vec<String>,
}

impl BrokerLog {
    fn drain(&mut self) {
        for line in self.rx.try_iter() {
            eprintln!("{}: broker| {line}", self.name);
            self.lines.push(line);
        }
    }

    fn count(&self, text: &str) -> usize {
        self.lines.iter().filter(|l| l.contains(text)).count()
    }

    /// The broker still runs, has not panicked and has failed no log.
    fn check_healthy(&mut self, broker: &mut Broker, when: &str) {
        std::thread::sleep(Duration::from_millis(100));
        self.drain();
        if let Some(status) = broker.child.try_wait().expect("try_wait") {
            panic!("{when}: the broker exited: {status}");
        }
        for bad in ["panicked", "log failed"] {
            if let Some(line) = self.lines.iter().find(|l| l.contains(bad)) {
                panic!("{when}: the broker logged {line:?}");
            }
        }
    }
}

fn value(i: u64) -> String {
    format!("{i:08}:{}", "x".repeat(VALUE_BYTES - 9))
}

/// Every record sent so far: the acknowledged ones by partition, in send
/// order, with their offsets (`None`: sent by `shardlog produce`, which does
/// not print them).
#[derive(Default)]
struct Sent {
    acked: Vec<(u32, Option<u64>, u64)>,
    failed: u64,
    next: u64,
}

impl Sent {
    fn take(&mut self) -> u64 {
        self.next += 1;
        self.next - 1
    }
}

/// Sends `per_partition` records to each partition and waits for them; the
/// failures, by partition.
async fn send_round(producer: &Producer, sent: &mut Sent, per_partition: usize) -> Vec<(u32, ClientError)> {
    let mut pending = Vec::new();
    for p in 0..PARTITIONS {
        for _ in 0..per_partition {
            let i = sent.take();
            let record = ProducerRecord::new(TOPIC, value(i)).with_partition(p);
            pending.push((p, i, producer.send(record).await.expect("send")));
        }
    }
    let mut errors = Vec::new();
    for (p, i, delivery) in pending {
        match delivery.await {
            Ok(md) => {
                assert_eq!(md.partition, p);
                sent.acked.push((p, Some(md.offset), i));
            }
            Err(e) => {
                sent.failed += 1;
                errors.push((p, e));
            }
        }
    }
    errors
}

/// Sends one record to `p`; whether it was acknowledged, or its error.
async fn send_one(producer: &Producer, sent: &mut Sent, p: u32) -> Result<(), ClientError> {
    let i = sent.take();
    let record = ProducerRecord::new(TOPIC, value(i)).with_partition(p);
    match producer.send(record).await.expect("send").await {
        Ok(md) => {
            sent.acked.push((p, Some(md.offset), i));
            Ok(())
        }
        Err(e) => {
            sent.failed += 1;
            Err(e)
        }
    }
}

/// The producer's error for a full disk: typed, not retriable, saying why.
fn assert_no_space(p: u32, e: &ClientError) {
    assert_eq!(e.code(), Some(ErrorCode::StorageFull), "partition {p}: a typed storage error, not {e:?}");
    assert!(!e.is_retriable(), "partition {p}: a full disk is not retried by the producer: {e}");
    assert!(e.to_string().contains("no space left on device"), "partition {p}: {e}");
}

/// Each partition holds exactly the acknowledged records, at their
/// acknowledged offsets, in send order, read by `shardlog consume`.
fn check_log(broker: &Broker, sent: &Sent, when: &str) {
    let described = broker.ok(&["topic", "describe", TOPIC, "--output", "json"], "");
    let described: serde_json::Value = serde_json::from_str(&described).expect("json");
    for p in 0..PARTITIONS {
        let want: Vec<(Option<u64>, u64)> =
            sent.acked.iter().filter(|a| a.0 == p).map(|&(_, offset, i)| (offset, i)).collect();
        let end = described["partitions"][p as usize]["end_offset"].as_u64().expect("end_offset");
        assert_eq!(
            end,
            want.len() as u64,
            "{when}: partition {p} ends after exactly the acknowledged records"
        );
        let out = broker.ok(
            &[
                "consume",
                TOPIC,
                "--partition",
                &p.to_string(),
                "--offset",
                "0",
                "--max-messages",
                &want.len().to_string(),
                "--idle-timeout-ms",
                "5000",
                "--format",
                "json",
            ],
            "",
        );
        let stored: Vec<(u64, u64)> = out
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json");
                let value = v["value"].as_str().expect("value");
                let i = value.split(':').next().and_then(|n| n.parse().ok()).expect("numbered value");
                assert_eq!(value, self::value(i), "{when}: partition {p}: record {i} intact");
                (v["offset"].as_u64().expect("offset"), i)
            })
            .collect();
        assert_eq!(stored.len(), want.len(), "{when}: partition {p}: every acknowledged record is read");
        for (k, (&(offset, i), &(want_offset, want_i))) in stored.iter().zip(&want).enumerate() {
            assert_eq!(offset, k as u64, "{when}: partition {p}: offsets without gaps");
            assert_eq!(i, want_i, "{when}: partition {p}, offset {offset}: records in send order");
            if let Some(want_offset) = want_offset {
                assert_eq!(
                    offset, want_offset,
                    "{when}: partition {p}: record {i} at its acknowledged offset"
                );
            }
        }
    }
}

/// The broker's side, with a producer without idempotence (each batch
/// stands alone).
#[test]
fn full_disk_fails_produces_typed_serves_reads_and_recovers_without_restart() {
    full_disk("disk full", false);
}

/// The same with the producer's default, idempotence: only the batches the
/// broker refused fail, with the storage error, and the producer goes on
/// once space returns.
#[test]
fn idempotent_producer_gets_the_storage_error_and_resumes_after_disk_full() {
    full_disk("disk full (idempotent)", true);
}

/// Steps 1 to 3 of the module docs; `name` starts each line it prints.
fn full_disk(name: &str, enable_idempotence: bool) {
    let started = Instant::now();
    let Some(mut fs) = LoopFs::mount(FS_BYTES) else { return };
    let data = tempfile::tempdir_in(&fs.mnt).expect("data directory on the small filesystem");
    let mut child =
        serve_command(data.path(), 2, &[]).stderr(Stdio::piped()).spawn().expect("spawn shardlog serve");
    let mut log = BrokerLog {
        name: name.to_string(),
        rx: lines_of(child.stderr.take().expect("stderr")),
        lines: Vec::new(),
    };
    let (child, ready) = wait_ready(child);
    let mut broker = Broker::adopt(child, ready, data, &[]);
    let segment_bytes = format!("segment.bytes={SEGMENT_BYTES}");
    broker.ok(&["topic", "create", TOPIC, "--partitions", "2", "--config", &segment_bytes], "");

    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let config = ProducerConfig {
        client: ClientConfig::new(broker.listen.clone()),
        acks: Acks::Leader,
        linger_ms: 1,
        enable_idempotence,
        ..ProducerConfig::default()
    };
    let producer = rt.block_on(Producer::new(config)).expect("producer");
    let mut sent = Sent::default();

    // Before: room to spare.
    let errors = rt.block_on(send_round(&producer, &mut sent, 100));
    assert!(errors.is_empty(), "with room to spare: {errors:?}");

    // 1. The filler leaves 2 MiB; records fill it until the broker says no.
    fs.fill_leaving(LEAVE_BYTES);
    eprintln!("{name}: the filler leaves {} bytes free", fs.avail());
    let mut errors = Vec::new();
    for _ in 0..200 {
        errors = rt.block_on(send_round(&producer, &mut sent, 50));
        if !errors.is_empty() {
            break;
        }
    }
    let (p, e) = errors.first().expect("the disk filled up within 200 rounds of 100 KB");
    eprintln!(
        "{name}: {} records acknowledged, then partition {p} failed ({} bytes free): {e}",
        sent.acked.len(),
        fs.avail()
    );
    for (p, e) in &errors {
        assert_no_space(*p, e);
    }
    // The filler takes the rest; single records use up what the active
    // segments have preallocated, until every partition fails each time.
    fs.fill_leaving(0);
    let mut failed_in_a_row = [0u32; PARTITIONS as usize];
    for attempt in 0.. {
        assert!(attempt < 2000, "the partitions keep taking records on a full disk: {failed_in_a_row:?}");
        if failed_in_a_row.iter().all(|&n| n >= 3) {
            break;
        }
        for p in 0..PARTITIONS {
            match rt.block_on(send_one(&producer, &mut sent, p)) {
                Ok(()) => failed_in_a_row[p as usize] = 0,
                Err(e) => {
                    assert_no_space(p, &e);
                    failed_in_a_row[p as usize] += 1;
                }
            }
        }
    }
    log.check_healthy(&mut broker, "disk full");
    assert!(log.count("no space left on device") > 0, "the broker says why appends fail");
    // New producers: `shardlog produce` fails, saying why. With idempotence
    // (its default) the broker may first have to reserve producer ids
    // (`producer_ids.json`), which fails the same way.
    for flags in [&[][..], &["--no-idempotence"][..]] {
        let i = sent.take();
        sent.failed += 1;
        let args = [&["produce", TOPIC, "--partition", "0"][..], flags].concat();
        let out = broker.run(&args, format!("{}\n", value(i)));
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "{name}: `shardlog {}` exits with {} and says: {}",
            args.join(" "),
            out.status,
            stderr.trim()
        );
        assert!(!out.status.success(), "`shardlog {}` fails on a full disk", args.join(" "));
        assert!(
            stderr.contains("StorageFull") && stderr.to_lowercase().contains("no space left on device"),
            "`shardlog {}` names the storage error: {stderr}",
            args.join(" ")
        );
    }
    eprintln!(
        "{name}: {} records acknowledged, {} failed, {} bytes free",
        sent.acked.len(),
        sent.failed,
        fs.avail()
    );

    // 2. Consumers read everything acknowledged while the disk is full.
    check_log(&broker, &sent, "while the disk is full");
    log.check_healthy(&mut broker, "reading on a full disk");

    // 3. Space returns: the same producer resumes, no restart.
    fs.free();
    eprintln!("{name}: filler deleted, {} bytes free", fs.avail());
    let freed = Instant::now();
    for p in 0..PARTITIONS {
        loop {
            match rt.block_on(send_one(&producer, &mut sent, p)) {
                Ok(()) => break,
                Err(e) => {
                    assert!(
                        freed.elapsed() < RESUME_WITHIN,
                        "partition {p}: producing did not resume within {RESUME_WITHIN:?} of space \
                         returning: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }
    eprintln!("{name}: producing resumed {:?} after space returned", freed.elapsed());
    // A new producer too.
    let i = sent.take();
    broker.ok(&["produce", TOPIC, "--partition", "1"], format!("{}\n", value(i)));
    sent.acked.push((1, None, i));
    // And on over several segment rolls.
    for _ in 0..4 {
        let errors = rt.block_on(send_round(&producer, &mut sent, 100));
        assert!(errors.is_empty(), "after space returned: {errors:?}");
    }
    check_log(&broker, &sent, "after space returned");
    log.check_healthy(&mut broker, "after space returned");
    rt.block_on(producer.close()).expect("close the producer");
    // Still there after a crash (segments whose rolls failed included).
    broker.kill_and_restart();
    check_log(&broker, &sent, "after a SIGKILL and restart");
    signal_and_wait(&mut broker.child, "-TERM", "the broker stops cleanly");
    log.drain();
    eprintln!(
        "{name}: {} records acknowledged and read back in order, {} failed with StorageFull, in {:?}",
        sent.acked.len(),
        sent.failed,
        started.elapsed()
    );
}
