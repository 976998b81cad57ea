//! fleet-updater: the device agent (being built: see the updater issue).
fn main() {
    eprintln!("fleet-updater is not built yet");
    std::process::exit(2);
}
