//! A candidate "binary" for fault injection in whole-device tests and the demo: a real ELF executable (the updater
//! runs nothing else) that runs the shell script appended to its own file after a marker line, as
//! `/bin/sh -c <script> <argv0> <args…>`. `fleet_vm_tests::builds::script_candidate` writes such files.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

/// Written between the ELF and the script (`fleet_vm_tests::builds::SCRIPT_MARKER`).
const MARKER: &[u8] = b"\n#fleet-script-candidate\n";

fn main() -> ExitCode {
    let exe = match std::fs::read("/proc/self/exe") {
        Ok(b) => b,
        Err(e) => {
            eprintln!("script-candidate: reading /proc/self/exe: {e}");
            return ExitCode::from(127);
        }
    };
    // The last marker: the constant above also sits inside the ELF itself.
    let Some(at) = exe.windows(MARKER.len()).rposition(|w| w == MARKER) else {
        eprintln!("script-candidate: no script appended");
        return ExitCode::from(127);
    };
    let script = String::from_utf8_lossy(&exe[at + MARKER.len()..]).into_owned();
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let err = Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .arg(argv0)
        .args(args)
        .exec();
    eprintln!("script-candidate: exec /bin/sh: {err}");
    ExitCode::from(127)
}
