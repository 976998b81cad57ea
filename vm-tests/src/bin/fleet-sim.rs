//! `fleet-sim`: simulated devices over real NATS (`fleet_vm_tests::sim`), for `scripts/bench fleet-scale`.

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match fleet_vm_tests::sim::args::parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fleet-sim: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = fleet_vm_tests::sim::run::run(&args) {
        eprintln!("fleet-sim: {e}");
        std::process::exit(1);
    }
}
