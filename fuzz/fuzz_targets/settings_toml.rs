#![no_main]
//! See `shardlog_fuzz_checks::settings_toml` for the properties checked.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| shardlog_fuzz_checks::settings_toml(data));
