//! A data directory on tmpfs (no O_DIRECT) falls back to buffered I/O.

mod log_support;

use log_support::*;
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::Log;

#[test]
fn tmpfs_falls_back_to_buffered_io() {
    trace();
    let shm = std::path::Path::new("/dev/shm");
    let on_tmpfs = std::process::Command::new("stat")
        .args(["-f", "-c", "%T", "/dev/shm"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "tmpfs");
    if !on_tmpfs {
        eprintln!("SKIP: /dev/shm is not tmpfs here; the tmpfs fallback is not exercised");
        return;
    }
    let tmp = tempfile::tempdir_in(shm).unwrap();
    let config = small_config(16 << 10, 512, FlushPolicy::Always);
    let path = tmp.path().join("t-0");
    let expected = run(async {
        let log = Log::open(path.clone(), config.clone()).await.unwrap();
        assert!(!log.direct_io(), "tmpfs has no O_DIRECT");
        let mut expected = Vec::new();
        for i in 0..100 {
            expected.push(append_one(&log, &make_batch(3, 333, 1, i), 0).await);
        }
        assert!(log.segment_count() > 1);
        check_against(&expected, &read_all(&log, 0, 5000).await, 0);
        log.close().await.unwrap();
        expected
    });
    run(async {
        let log = Log::open(path, config).await.unwrap();
        check_against(&expected, &read_all(&log, 17, 5000).await, 17);
        log.close().await.unwrap();
    });
    // Nothing is preallocated on tmpfs: fallocate there allocates (and
    // zeroes) every page up front, a stall for the write behind it.
    let big = tmp.path().join("t-1");
    run(async {
        let log = Log::open(big.clone(), small_config(64 << 20, 512, FlushPolicy::Never)).await.unwrap();
        for i in 0..10 {
            append_one(&log, &make_batch(3, 333, 1, i), 0).await;
        }
        let allocated: u64 = std::fs::read_dir(&big)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .map(|p| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap()) * 512)
            .sum();
        assert!(allocated <= 64 << 10, "{allocated} bytes allocated for about 10 KB of data");
        log.close().await.unwrap();
    });
    let disk = tempfile::tempdir().unwrap();
    run(async {
        let log = Log::open(disk.path().join("t-0"), small_config(16 << 10, 512, FlushPolicy::Never))
            .await
            .unwrap();
        assert!(log.direct_io(), "a disk filesystem gets O_DIRECT");
        log.close().await.unwrap();
    });
}
