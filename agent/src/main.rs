//! fleet-agent: the device agent (being built: see the agent issue).
fn main() {
    eprintln!("fleet-agent is not built yet");
    std::process::exit(2);
}
