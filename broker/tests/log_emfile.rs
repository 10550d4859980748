//! Out of file descriptors (EMFILE): opens fail with a typed error
//! (`TooManyOpenFiles`, client code `ResourceLimit`), never a panic, nothing
//! acknowledged is lost, and the logs work again once descriptors return.
//!
//! Its own test binary: it lowers the process's open-files limit.

mod log_support;

use log_support::*;
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::{FileBudget, Log, LogError, LogOptions, OPEN_FILES_SHARD_MIN};
use shardlog_schema::ErrorCode;

const LOGS: usize = OPEN_FILES_SHARD_MIN + 4;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("procfs").count()
}

fn set_soft_limit(to: libc::rlim_t) -> libc::rlim_t {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit for getrlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    let old = lim.rlim_cur;
    lim.rlim_cur = to;
    // SAFETY: `lim` is a valid rlimit; lowering the soft limit needs no privilege.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    old
}

/// Waits until closes the file budget issued (asynchronously) have landed:
/// the fd count stays the same for a while (bounded by a deadline).
async fn settle_fds() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (mut last, mut same) = (open_fds(), 0);
    while same < 20 && std::time::Instant::now() < deadline {
        glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        let now = open_fds();
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
}

fn expect_out_of_files(e: &LogError) {
    assert!(e.is_out_of_files(), "typed error, got: {e}");
    assert_eq!(e.error_code(), ErrorCode::ResourceLimit);
    assert!(e.to_string().contains("too many open files"), "{e}");
}

#[test]
fn out_of_descriptors_is_a_typed_error_and_service_resumes() {
    run_in_tempdir(|root| async move {
        let files = FileBudget::new(OPEN_FILES_SHARD_MIN);
        let options = LogOptions { files: files.clone(), ..LogOptions::default() };
        // The first logs go idle (flush `never`: their write fds may close);
        // the last OPEN_FILES_SHARD_MIN keep unsynced data (a flush interval
        // of an hour), so the budget cannot close theirs.
        let config = small_config(1 << 20, 1024, FlushPolicy::Never);
        let busy = small_config(1 << 20, 1024, FlushPolicy::Interval { ms: 3_600_000, bytes: 1 << 30 });
        let mut logs = Vec::new();
        let mut expected = vec![Vec::new(); LOGS];
        for (i, want) in expected.iter_mut().enumerate() {
            let c = if i < LOGS - OPEN_FILES_SHARD_MIN { config.clone() } else { busy.clone() };
            let log = Log::open_with(root.join(format!("p-{i}")), c, options.clone()).await.unwrap();
            want.push(append_one(&log, &make_batch(2, 100, 1, i as u64), 0).await);
            logs.push(log);
        }
        // More logs than the budget: the idle logs' write fds are closed now.
        assert!(files.evictions() >= (LOGS - OPEN_FILES_SHARD_MIN) as u64, "{files:?}");

        settle_fds().await;
        // Exhaust the descriptors: limit at the current count, every free
        // slot below it taken.
        let old = set_soft_limit(open_fds() as libc::rlim_t);
        let mut hold = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            hold.push(f);
        }
        let mut failed = 0;
        for (i, log) in logs.iter().enumerate() {
            match log.append(&make_batch(1, 100, 2, 100 + i as u64), 0).await {
                Ok(info) => {
                    let mut stored = make_batch(1, 100, 2, 100 + i as u64);
                    shardlog_schema::batch::stamp(&mut stored, info.base_offset.0, 0);
                    expected[i].push(Appended {
                        base: info.base_offset.0,
                        last: info.last_offset.0,
                        bytes: stored,
                    });
                }
                Err(e) => {
                    expect_out_of_files(&e);
                    failed += 1;
                }
            }
        }
        assert_eq!(failed, LOGS - OPEN_FILES_SHARD_MIN, "appends to the idle logs need a new fd");
        let opened = Log::open_with(root.join("new"), config.clone(), options.clone()).await;
        expect_out_of_files(&opened.err().expect("no descriptor for a new log"));

        // Descriptors return: every log appends again; nothing acknowledged
        // was lost and no failed append left bytes behind.
        drop(hold);
        set_soft_limit(old);
        for (i, log) in logs.iter().enumerate() {
            expected[i].push(append_one(log, &make_batch(3, 100, 3, 200 + i as u64), 0).await);
        }
        for (log, want) in logs.iter().zip(&expected) {
            check_against(want, &read_all(log, 0, 1 << 20).await, 0);
        }
    });
}
