//! libFuzzer target: the properties of `checks::fetch_lines` on arbitrary bytes.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::fetch_lines(data));
