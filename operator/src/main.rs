//! fleet-operator: the device agent (being built: see the operator issue).
fn main() {
    eprintln!("fleet-operator is not built yet");
    std::process::exit(2);
}
