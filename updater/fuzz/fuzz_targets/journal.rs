//! libFuzzer target: the properties of `checks::journal` on arbitrary bytes.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::journal(data));
