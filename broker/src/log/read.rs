//! The read side: fetch by offset, lookup by timestamp.

use super::*;
use segment::{scan_headers, search_index_file, ScannedBatch};
use shardlog_schema::batch::BATCH_HEADER_BYTES;

/// Where a read goes, decided under one short borrow.
struct Plan {
    base: u64,
    reader: Option<Rc<SegmentFile>>,
    /// End of readable data in this segment (high watermark or segment size).
    data_end: u64,
    /// Offset after `data_end`.
    end_next: u64,
    /// Base of the next segment (sealed segments only).
    next_base: u64,
    active: bool,
    /// `[start, start + len)` of the active segment, from memory.
    tail: Option<(u64, Bytes)>,
}

fn plan_for(st: &State, config: &TopicConfig, offset: u64) -> Plan {
    let (hw, hw_pos) = st.high_watermark(config);
    if offset >= st.active.base {
        let a = &st.active;
        let tail = (hw_pos > a.tail_start)
            .then(|| (a.tail_start, Bytes::copy_from_slice(&a.tail[..(hw_pos - a.tail_start) as usize])));
        Plan {
            base: a.base,
            reader: a.reader.get(),
            data_end: hw_pos,
            end_next: hw,
            next_base: hw,
            active: true,
            tail,
        }
    } else {
        let i = st.closed.partition_point(|s| s.base <= offset).checked_sub(1).expect("offset >= start");
        let s = &st.closed[i];
        Plan {
            base: s.base,
            reader: s.reader.get(),
            data_end: s.size(),
            end_next: s.summary.next_offset,
            next_base: st.closed.get(i + 1).map_or(st.active.base, |n| n.base),
            active: false,
            tail: None,
        }
    }
}

/// Where the `.log` (or `.index`) read handle of segment `base` is cached.
fn reader_slot(st: &State, base: u64, index: bool) -> Option<Rc<ReaderSlot<SegmentFile>>> {
    if let Ok(i) = st.closed.binary_search_by_key(&base, |s| s.base) {
        let s = &st.closed[i];
        return Some(if index { &s.index_reader } else { &s.reader }.clone());
    }
    (!index && st.active.base == base).then(|| st.active.reader.clone())
}

/// The `.log` (or `.index`) read handle of a segment: the cached one, or
/// opened (counted in the shard's file budget) and cached.
pub(super) async fn segment_reader(sh: &Shared, base: u64, index: bool) -> Result<Rc<SegmentFile>, LogError> {
    let slot = reader_slot(&sh.st.borrow(), base, index);
    if let Some(f) = slot.as_ref().and_then(ReaderSlot::get) {
        return Ok(f);
    }
    let path = segment::segment_path(&sh.dir, base, if index { INDEX_EXT } else { LOG_EXT });
    let f = Rc::new(SegmentFile::open_counted(&path, &sh.files, !index && sh.direct_reads).await?);
    // Deleted by retention or rolled meanwhile: use it once, uncached.
    let Some(slot) = slot else { return Ok(f) };
    let mut st = sh.st.borrow_mut();
    let still_cached = reader_slot(&st, base, index).is_some_and(|s| Rc::ptr_eq(&s, &slot));
    if !still_cached {
        return Ok(f);
    }
    let was_open = slot.is_open();
    let f = slot.put(f);
    if !was_open && st.closed.binary_search_by_key(&base, |s| s.base).is_ok() {
        st.note_open_reader(base, index, sh.open_readers_max);
    }
    Ok(f)
}

/// The batch header at `pos` of the hot tail window, if it is held whole.
fn hot_header(w: &hot::HotWindow, pos: u64) -> Option<BatchHeader> {
    if pos + BATCH_HEADER_BYTES as u64 > w.end {
        return None;
    }
    let mut buf = [0u8; BATCH_HEADER_BYTES];
    w.copy_to(pos, &mut buf);
    BatchHeader::parse(&buf).ok()
}

/// Serves a read from the hot tail window (no file access, no await) when
/// the whole answer lies in it; `None` sends the read to the file path.
/// Mirrors the file path: index lookup, then a header scan of at most one
/// index interval, from the window start when the index entry precedes it.
fn read_hot(sh: &Shared, st: &State, from: u64, max_bytes: usize, cap: u64) -> Option<LogRead> {
    let a = &st.active;
    if from < a.base {
        return None;
    }
    let (hw, data_end) = st.high_watermark(&sh.config);
    let w = sh.hot.try_borrow().ok()?;
    if !w.covers(a.base, w.start, data_end) || data_end <= w.start {
        return None;
    }
    let entry = a.index.lookup_offset(u32::try_from(from - a.base).unwrap_or(u32::MAX));
    let mut pos = u64::from(entry.pos).max(w.start);
    let (start_pos, first) = loop {
        if pos >= data_end {
            return None;
        }
        let h = hot_header(&w, pos)?;
        if h.base_offset > from {
            return None; // the batch holding `from` precedes the window
        }
        if h.last_offset() >= from {
            break (pos, h);
        }
        pos += h.total_bytes() as u64;
    };
    if first.last_offset() >= cap {
        return Some(LogRead::empty(Offset(from)));
    }
    let first_end = start_pos + first.total_bytes() as u64;
    let limit = (start_pos + max_bytes as u64).max(first_end).min(data_end);
    let (mut end_pos, mut last_offset) = (first_end, first.last_offset());
    if limit >= data_end && hw <= cap {
        end_pos = data_end;
        last_offset = hw - 1;
    } else if limit > first_end {
        let e = a.index.lookup_pos(limit);
        if u64::from(e.pos) > first_end && a.base + u64::from(e.rel_offset) <= cap {
            end_pos = u64::from(e.pos);
            last_offset = a.base + u64::from(e.rel_offset) - 1;
        }
        while let Some(h) = hot_header(&w, end_pos) {
            let end = end_pos + h.total_bytes() as u64;
            if end > limit || h.last_offset() >= cap {
                break;
            }
            end_pos = end;
            last_offset = h.last_offset();
        }
    }
    if end_pos > data_end || !w.covers(a.base, start_pos, end_pos) {
        return None;
    }
    Some(LogRead {
        first_offset: Offset(first.base_offset),
        last_offset: Offset(last_offset),
        bytes: (end_pos - start_pos) as usize,
        chunks: w.slices(start_pos, end_pos).into_iter().map(ReadChunk::Memory).collect(),
    })
}

/// Index lookup in the segment at `base`: by relative offset or by position.
async fn lookup(sh: &Shared, base: u64, target: u64, by_pos: bool) -> Result<IndexEntry, LogError> {
    let (entries, range) = {
        let st = sh.st.borrow();
        if st.active.base == base {
            let ix = &st.active.index;
            return Ok(if by_pos {
                ix.lookup_pos(target)
            } else {
                ix.lookup_offset(u32::try_from(target).unwrap_or(u32::MAX))
            });
        }
        match st.closed.binary_search_by_key(&base, |s| s.base) {
            Ok(i) => {
                let s = &st.closed[i].summary;
                (s.index_entries, if by_pos { s.log_bytes } else { s.next_offset - base })
            }
            // Deleted by retention meanwhile: scan from the start of the file.
            Err(_) => return Ok(IndexEntry { rel_offset: 0, pos: 0 }),
        }
    };
    let f = segment_reader(sh, base, true).await?;
    if by_pos {
        search_index_file(&f, entries, target, range, |e| u64::from(e.pos)).await
    } else {
        search_index_file(&f, entries, target, range, |e| u64::from(e.rel_offset)).await
    }
}

fn add(c: &Cell<u64>, n: u64) {
    c.set(c.get() + n);
}

pub(super) async fn read(sh: &Rc<Shared>, from: Offset, max_bytes: usize) -> Result<LogRead, LogError> {
    read_capped(sh, from, max_bytes, u64::MAX).await
}

/// [`read`] that returns no batch ending at or after `cap`.
pub(super) async fn read_capped(
    sh: &Rc<Shared>,
    from: Offset,
    max_bytes: usize,
    cap: u64,
) -> Result<LogRead, LogError> {
    let mut at = from.0;
    // Compaction may have emptied the end of a sealed segment: a read that
    // finds no batch at or after `at` there goes on at the next segment.
    let (plan, reader, first) = loop {
        let plan = {
            let st = sh.st.borrow();
            let (start, end) = (st.start_offset(), st.active.next_offset);
            if at < start || at > end {
                return Err(LogError::OffsetOutOfRange {
                    requested: from,
                    start: Offset(start),
                    end: Offset(end),
                });
            }
            if at >= st.high_watermark(&sh.config).0.min(cap) {
                return Ok(LogRead::empty(Offset(at)));
            }
            if let Some(hot) = read_hot(sh, &st, at, max_bytes, cap) {
                add(&sh.io_stats.hot_tail_hits, 1);
                return Ok(hot);
            }
            add(&sh.io_stats.hot_tail_misses, 1);
            plan_for(&st, &sh.config, at)
        };
        let reader = match plan.reader.clone() {
            Some(r) => r,
            None => segment_reader(sh, plan.base, false).await?,
        };
        let entry = lookup(sh, plan.base, at - plan.base, false).await?;
        let mut first: Option<ScannedBatch> = None;
        scan_headers(&reader, u64::from(entry.pos), plan.data_end, |b| {
            if b.header.last_offset() >= at {
                first = Some(b);
                false
            } else {
                true
            }
        })
        .await?;
        match first {
            Some(first) => break (plan, reader, first),
            None if !plan.active && plan.next_base > at => at = plan.next_base,
            None => return Ok(LogRead::empty(Offset(at))),
        }
    };
    if first.header.last_offset() >= cap {
        return Ok(LogRead::empty(from));
    }
    let start_pos = first.pos;
    let first_end = start_pos + first.header.total_bytes() as u64;
    let limit = (start_pos + max_bytes as u64).max(first_end).min(plan.data_end);
    let (mut end_pos, mut last_offset) = (first_end, first.header.last_offset());
    if limit >= plan.data_end && plan.end_next <= cap {
        end_pos = plan.data_end;
        last_offset = plan.end_next - 1;
    } else if limit > first_end {
        let e = lookup(sh, plan.base, limit, true).await?;
        if u64::from(e.pos) > first_end && plan.base + u64::from(e.rel_offset) <= cap {
            end_pos = u64::from(e.pos);
            last_offset = plan.base + u64::from(e.rel_offset) - 1;
        }
        scan_headers(&reader, end_pos, plan.data_end, |b| {
            let end = b.pos + b.header.total_bytes() as u64;
            if end > limit || b.header.last_offset() >= cap {
                return false;
            }
            end_pos = end;
            last_offset = b.header.last_offset();
            true
        })
        .await?;
    }
    let mut chunks = Vec::with_capacity(2);
    let mem_from = match &plan.tail {
        Some((tail_start, _)) if plan.active && end_pos > *tail_start => (*tail_start).max(start_pos),
        _ => end_pos,
    };
    if mem_from > start_pos {
        chunks.push(ReadChunk::File {
            file: reader,
            position: start_pos,
            len: (mem_from - start_pos) as usize,
        });
    }
    if let Some((tail_start, bytes)) = plan.tail.filter(|_| mem_from < end_pos) {
        let a = (mem_from - tail_start) as usize;
        let b = (end_pos - tail_start) as usize;
        chunks.push(ReadChunk::Memory(bytes.slice(a..b)));
    }
    Ok(LogRead {
        first_offset: Offset(first.header.base_offset),
        last_offset: Offset(last_offset),
        bytes: (end_pos - start_pos) as usize,
        chunks,
    })
}

pub(super) async fn offset_for_timestamp(
    sh: &Rc<Shared>,
    ts: i64,
) -> Result<Option<(Offset, i64)>, LogError> {
    // Pick the first segment whose largest timestamp reaches `ts`.
    let (plan, start) = {
        let st = sh.st.borrow();
        let seg = st.closed.iter().find(|s| s.summary.max_timestamp >= ts);
        match seg {
            Some(s) => (plan_for(&st, &sh.config, s.base), None),
            None if st.active.index.max_timestamp >= ts => {
                let p = plan_for(&st, &sh.config, st.active.base);
                let start = index::time_lookup(&st.active.index.times, ts);
                (p, Some(start))
            }
            None => return Ok(None),
        }
    };
    let start_pos = match start {
        Some((_, pos)) => u64::from(pos),
        None => {
            let entries = {
                let st = sh.st.borrow();
                st.closed
                    .binary_search_by_key(&plan.base, |s| s.base)
                    .ok()
                    .map(|i| st.closed[i].summary.time_entries)
            };
            let Some(entries) = entries else { return Ok(None) };
            let path = segment::segment_path(&sh.dir, plan.base, TIME_INDEX_EXT);
            let times = segment::read_time_index(&path, entries).await?;
            u64::from(index::time_lookup(&times, ts).1)
        }
    };
    let reader = match plan.reader.clone() {
        Some(r) => r,
        None => segment_reader(sh, plan.base, false).await?,
    };
    let mut found: Option<ScannedBatch> = None;
    scan_headers(&reader, start_pos, plan.data_end, |b| {
        if b.header.max_timestamp >= ts {
            found = Some(b);
            false
        } else {
            true
        }
    })
    .await?;
    let Some(b) = found else { return Ok(None) };
    let bytes = reader.read_bytes(b.pos, b.header.total_bytes()).await?;
    if b.header.attributes & batch::ATTR_TIMESTAMP_LOG_APPEND != 0 {
        return Ok(Some((Offset(b.header.base_offset), b.header.max_timestamp)));
    }
    let hit = batch::records(&bytes)
        .ok()
        .and_then(|recs| recs.iter().find(|r| r.timestamp_ms >= ts).map(|r| (r.offset, r.timestamp_ms)));
    Ok(Some(match hit {
        Some((o, t)) => (Offset(o), t),
        None => (Offset(b.header.base_offset), b.header.max_timestamp),
    }))
}
