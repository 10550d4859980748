//! Disk full: appends fail with a typed storage error, the log stays
//! consistent and readable, and appends work again once space is freed.
//! Uses a loop-mounted 64 MiB ext4 image (needs root and loop devices); when
//! that is impossible it says why and falls back to a size-limited tmpfs,
//! and failing that, skips with a message.

mod log_support;

use log_support::*;
use shardlog_broker::config::FlushPolicy;
use shardlog_broker::log::{Log, LogError};
use shardlog_schema::ErrorCode;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Unmounts on drop.
struct Mount {
    dir: PathBuf,
}

impl Drop for Mount {
    fn drop(&mut self) {
        let ok = Command::new("umount").arg(&self.dir).status().is_ok_and(|s| s.success());
        // glommio closes dropped files asynchronously; a close still queued
        // when the executor stops keeps the mount busy: detach it lazily.
        let lazy = ok || Command::new("umount").arg("-l").arg(&self.dir).status().is_ok_and(|s| s.success());
        if !lazy {
            eprintln!("warning: could not unmount {}", self.dir.display());
        }
    }
}

fn sh(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn mount_small_fs(root: &Path) -> Result<(Mount, &'static str), String> {
    let mnt = root.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
    let img = root.join("fs.img");
    let img_s = img.to_str().unwrap();
    let ext4 = sh("truncate", &["-s", "64M", img_s])
        .and_then(|()| sh("mkfs.ext4", &["-q", img_s]))
        .and_then(|()| sh("mount", &["-o", "loop", img_s, mnt.to_str().unwrap()]));
    match ext4 {
        Ok(()) => Ok((Mount { dir: mnt }, "ext4 (loop)")),
        Err(why) => {
            eprintln!("cannot loop-mount an ext4 image ({why}); trying a size-limited tmpfs");
            sh("mount", &["-t", "tmpfs", "-o", "size=48m", "tmpfs", mnt.to_str().unwrap()])?;
            Ok((Mount { dir: mnt }, "tmpfs (size=48m)"))
        }
    }
}

#[test]
fn disk_full_fails_appends_cleanly_and_recovers() {
    trace();
    let tmp = tempfile::tempdir().unwrap();
    let (mount, kind) = match mount_small_fs(tmp.path()) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("SKIP: no small filesystem can be mounted here ({why}); ENOSPC is not exercised");
            return;
        }
    };
    eprintln!("ENOSPC test on {kind} at {}", mount.dir.display());
    let filler = mount.dir.join("filler");
    std::fs::write(&filler, vec![7u8; 12 << 20]).unwrap();
    let path = mount.dir.join("t-0");
    let config = small_config(4 << 20, 4096, FlushPolicy::Never);
    run(async {
        let log = Log::open(path.clone(), config.clone()).await.unwrap();
        let mut expected = Vec::new();
        let mut tag = 0;
        let err = loop {
            tag += 1;
            assert!(tag < 10_000, "the filesystem never filled up");
            match log.append(&make_batch(4, 64 << 10, 1, tag), 0).await {
                Ok(info) => {
                    let mut stored = make_batch(4, 64 << 10, 1, tag);
                    shardlog_schema::batch::stamp(&mut stored, info.base_offset.0, 0);
                    expected.push(Appended {
                        base: info.base_offset.0,
                        last: info.last_offset.0,
                        bytes: stored,
                    });
                }
                Err(e) => break e,
            }
        };
        assert!(matches!(err, LogError::NoSpace { .. }), "typed disk-full error, got: {err}");
        assert_eq!(err.error_code(), ErrorCode::StorageFull);
        let end = expected.last().unwrap().last + 1;
        assert_eq!(log.end_offset().0, end, "a failed append assigns nothing");
        // Still full: still a clean error, still consistent.
        let again = log.append(&make_batch(4, 64 << 10, 1, 99_999), 0).await.unwrap_err();
        assert!(again.is_no_space(), "{again}");
        assert_eq!(log.end_offset().0, end);
        check_against(&expected, &read_all(&log, 0, 1 << 20).await, 0);
        // Free space: appends work again, offsets continue.
        std::fs::remove_file(&filler).unwrap();
        let a = append_one(&log, &make_batch(4, 64 << 10, 1, 123_456), 0).await;
        assert_eq!(a.base, end);
        expected.push(a);
        for i in 0..5 {
            expected.push(append_one(&log, &make_batch(1, 1000, 1, 200_000 + i), 0).await);
        }
        check_against(&expected, &read_all(&log, 0, 1 << 20).await, 0);
        log.close().await.unwrap();
        let log = Log::open(path.clone(), config.clone()).await.unwrap();
        check_against(&expected, &read_all(&log, 0, 1 << 20).await, 0);
        log.close().await.unwrap();
        drop(log);
        // Let glommio finish the asynchronous closes of the dropped files.
        glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
    });
    drop(mount);
}
