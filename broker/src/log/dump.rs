//! `shardlog log dump <file>`: prints every batch of a segment file (and
//! with `records` every record), like kafka-dump-log. Plain `std::fs`: it
//! runs in the CLI, outside the broker. Works on damaged files and says
//! where and why they break.

use shardlog_schema::batch::{self, BatchHeader, BATCH_HEADER_BYTES};
use std::io::{self, Read, Write};
use std::path::Path;

/// What a dump found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpSummary {
    pub batches: u64,
    pub records: u64,
    pub valid_bytes: u64,
    pub file_bytes: u64,
    pub first_offset: Option<u64>,
    pub next_offset: Option<u64>,
    /// `(position, reason)` of the first damage, if any.
    pub broken_at: Option<(u64, String)>,
}

/// Largest batch the dump will try to read.
const DUMP_BATCH_BYTES_MAX: usize = 1 << 30;

/// Dumps one `.log` segment file to `out`.
pub fn dump_segment(path: &Path, records: bool, out: &mut dyn Write) -> io::Result<DumpSummary> {
    let mut file = std::fs::File::open(path)?;
    let file_bytes = file.metadata()?.len();
    let mut s = DumpSummary { file_bytes, ..DumpSummary::default() };
    writeln!(out, "Dumping {} ({file_bytes} bytes)", path.display())?;
    let mut reader = io::BufReader::with_capacity(1 << 20, &mut file);
    let mut pos = 0u64;
    let mut expected_next: Option<u64> = None;
    while pos < file_bytes {
        let mut head = [0u8; BATCH_HEADER_BYTES];
        let have = read_up_to(&mut reader, &mut head)?;
        if have > 0 && head[..have.min(12)].iter().all(|&b| b == 0) {
            writeln!(out, "position: {pos} zeros from here on (preallocated or never written)")?;
            break;
        }
        if have < BATCH_HEADER_BYTES {
            s.broken_at = Some((pos, format!("torn batch header: {have} of {BATCH_HEADER_BYTES} bytes")));
            break;
        }
        let header = match BatchHeader::parse(&head) {
            Ok(h) => h,
            Err(e) => {
                s.broken_at = Some((pos, format!("bad batch header: {e}")));
                break;
            }
        };
        let total = header.total_bytes();
        if !(BATCH_HEADER_BYTES..=DUMP_BATCH_BYTES_MAX).contains(&total) {
            s.broken_at = Some((pos, format!("implausible batch length {total}")));
            break;
        }
        let mut whole = head.to_vec();
        whole.resize(total, 0);
        let got = read_up_to(&mut reader, &mut whole[BATCH_HEADER_BYTES..])?;
        if got < total - BATCH_HEADER_BYTES {
            print_batch(out, pos, &header, "torn")?;
            s.broken_at = Some((pos, format!("torn batch: {} of {total} bytes", BATCH_HEADER_BYTES + got)));
            break;
        }
        let check = batch::validate_stored(&whole, DUMP_BATCH_BYTES_MAX);
        let crc = if check.is_ok() { "ok" } else { "BAD" };
        print_batch(out, pos, &header, crc)?;
        if let Err(e) = check {
            s.broken_at = Some((pos, format!("invalid batch: {e}")));
            break;
        }
        if let Some(n) = expected_next.filter(|&n| n != header.base_offset) {
            writeln!(out, "  WARNING: base offset {} does not follow {}", header.base_offset, n)?;
        }
        if records {
            print_records(out, &whole)?;
        }
        s.first_offset.get_or_insert(header.base_offset);
        s.next_offset = Some(header.next_offset());
        expected_next = Some(header.next_offset());
        s.batches += 1;
        s.records += u64::from(header.record_count);
        pos += total as u64;
        s.valid_bytes = pos;
    }
    match &s.broken_at {
        Some((p, why)) => writeln!(out, "BROKEN at position {p}: {why}")?,
        None => {
            writeln!(out, "end: {} batches, {} records, {} valid bytes", s.batches, s.records, s.valid_bytes)?
        }
    }
    Ok(s)
}

fn print_batch(out: &mut dyn Write, pos: u64, h: &BatchHeader, crc: &str) -> io::Result<()> {
    writeln!(
        out,
        "baseOffset: {} lastOffset: {} count: {} position: {pos} size: {} leaderEpoch: {} \
         firstTimestamp: {} maxTimestamp: {} producerId: {} producerEpoch: {} baseSequence: {} \
         codec: {} crc: {:#010x} ({crc})",
        h.base_offset,
        h.last_offset(),
        h.record_count,
        h.total_bytes(),
        h.leader_epoch,
        h.first_timestamp,
        h.max_timestamp,
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
        h.codec(),
        h.crc,
    )
}

fn print_records(out: &mut dyn Write, whole: &[u8]) -> io::Result<()> {
    match batch::records(whole) {
        Ok(recs) => {
            for r in recs {
                writeln!(
                    out,
                    "| offset: {} timestamp: {} keySize: {} valueSize: {} headers: {} key: {} value: {}",
                    r.offset,
                    r.timestamp_ms,
                    r.key.map_or(-1, |k| k.len() as i64),
                    r.value.len(),
                    r.headers.len(),
                    r.key.map_or_else(|| "null".to_string(), show),
                    show(r.value),
                )?;
            }
            Ok(())
        }
        Err(e) => writeln!(out, "| records undecodable: {e}"),
    }
}

/// Printable text as is, anything else as hex (first 64 bytes).
fn show(b: &[u8]) -> String {
    let cut = &b[..b.len().min(64)];
    let more = if b.len() > 64 { "..." } else { "" };
    match std::str::from_utf8(cut) {
        Ok(s) if s.chars().all(|c| !c.is_control()) => format!("{s:?}{more}"),
        _ => format!("0x{}{more}", cut.iter().map(|x| format!("{x:02x}")).collect::<String>()),
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
