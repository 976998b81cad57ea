//! `test-lanes [cargo test args]`: the test phase of `scripts/test` — every test binary built by
//! `cargo test --no-run`, run in `FLEET_TEST_LANES` parallel lanes, then a table (`fleet_vm_tests::lanes`).

fn main() {
    std::process::exit(fleet_vm_tests::lanes::main(
        std::env::args().skip(1).collect(),
    ));
}
