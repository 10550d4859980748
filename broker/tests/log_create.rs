//! Creating logs: a wave of opens (`Log::open_wave`) creates the new ones
//! and recovers the existing ones side by side; a creation interrupted
//! before its files were durable is completed at the next open.

mod log_support;

use log_support::*;
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::{Log, LogOptions};

#[test]
fn a_wave_creates_new_logs_and_recovers_existing_ones() {
    trace();
    run_in_tempdir(|root| async move {
        let config = small_config(64 << 10, 4096, FlushPolicy::Never);
        let old = root.join("t-0");
        let log = Log::open(old.clone(), config.clone()).await.unwrap();
        let kept = append_one(&log, &make_batch(3, 50, 10, 1), 1).await;
        log.close().await.unwrap();

        // t-1 and t-2 are new; the data dir's parent of t-3 is too.
        let dirs = vec![old.clone(), root.join("t-1"), root.join("t-2"), root.join("sub").join("t-3")];
        let opened = Log::open_wave(dirs.clone(), &config, &LogOptions::default()).await;
        let logs: Vec<Log> = opened.into_iter().map(Result::unwrap).collect();
        check_against(std::slice::from_ref(&kept), &read_all(&logs[0], 0, 1 << 20).await, 0);
        for (dir, log) in dirs.iter().zip(&logs).skip(1) {
            assert_eq!(log.end_offset().0, 0, "{} is new", dir.display());
            let metadata = std::fs::read_to_string(dir.join("partition.metadata")).unwrap();
            assert!(metadata.contains("\"version\""), "{}: {metadata}", dir.display());
            assert!(dir.join("00000000000000000000.log").exists(), "{} has its first segment", dir.display());
        }
        let written = append_one(&logs[2], &make_batch(2, 30, 20, 2), 1).await;
        for log in logs {
            log.close().await.unwrap();
        }
        // A new log reopens as an existing one, with what was appended.
        let log = Log::open(dirs[2].clone(), config.clone()).await.unwrap();
        check_against(&[written], &read_all(&log, 0, 1 << 20).await, 0);
        log.close().await.unwrap();
    });
}

#[test]
fn one_log_of_a_wave_failing_leaves_the_others_open() {
    trace();
    run_in_tempdir(|root| async move {
        let config = small_config(64 << 10, 4096, FlushPolicy::Never);
        // A file where a log's directory should be: that log cannot open.
        std::fs::write(root.join("t-1"), b"not a directory").unwrap();
        let dirs = vec![root.join("t-0"), root.join("t-1"), root.join("t-2")];
        let mut opened = Log::open_wave(dirs, &config, &LogOptions::default()).await;
        let err = opened.remove(1).err().expect("t-1 cannot open");
        assert!(err.to_string().contains("t-1"), "the error names the log: {err}");
        for log in opened {
            let log = log.unwrap();
            append_one(&log, &make_batch(1, 10, 1, 3), 1).await;
            log.close().await.unwrap();
        }
    });
}

#[test]
fn a_creation_interrupted_before_its_files_were_durable_is_completed() {
    trace();
    run_in_tempdir(|root| async move {
        let config = small_config(64 << 10, 4096, FlushPolicy::Never);
        // What a machine crash can leave of a creation whose directory
        // entries reached the disk but not the file contents: an empty
        // metadata file (delayed allocation) and an empty first segment.
        let dir = root.join("t-0");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("partition.metadata"), b"").unwrap();
        std::fs::write(dir.join("00000000000000000000.log"), b"").unwrap();
        let log = Log::open(dir.clone(), config.clone()).await.unwrap();
        assert_eq!(log.end_offset().0, 0);
        let metadata = std::fs::read_to_string(dir.join("partition.metadata")).unwrap();
        assert!(metadata.contains("\"version\""), "rewritten: {metadata}");
        let a = append_one(&log, &make_batch(2, 20, 1, 4), 1).await;
        log.close().await.unwrap();
        let log = Log::open(dir, config).await.unwrap();
        check_against(&[a], &read_all(&log, 0, 1 << 20).await, 0);
        log.close().await.unwrap();
    });
}
