//! The device's root tools as one multicall program, on bootupd's model: `fleet-fetch`, `fleet-reboot`,
//! `fleet-token` and `fleet-boot-watchdog` are names (links) of one `fleet-tools` binary, which runs the tool its
//! name says. They share one copy of the HTTPS stack (rustls, ring, ureq) and of std instead of carrying one each;
//! the root daemon `fleet-updater` stays a separate binary with no HTTPS in it.

use std::ffi::OsStr;
use std::path::Path;

/// A tool: its installed name and its `main`, given the arguments after the name.
type Tool = (&'static str, fn(Vec<String>));

/// Every tool, by the name it is installed and started under.
pub const TOOLS: [Tool; 4] = [
    ("fleet-fetch", crate::fetch_helper::cli::main),
    ("fleet-reboot", crate::reboot::cli::main),
    ("fleet-token", crate::token::cli::main),
    ("fleet-boot-watchdog", crate::boot_watchdog::cli::main),
];

const HELP: &str = "\
fleet-tools: the Harmony Fleet device's root tools in one binary. Each is installed as a link to it and runs
when started under its name; `fleet-tools NAME [ARGS]` runs one too.

Tools: fleet-fetch (the updater's download helper), fleet-reboot (coordinated reboots through FleetLock),
fleet-token (the device's NATS token), fleet-boot-watchdog (reboots a host that did not finish booting).
`NAME --help` describes each.

Usage: fleet-tools NAME [ARGS] | fleet-tools --help | fleet-tools --version";

/// What a command line asks for.
pub enum Choice {
    /// Run this tool with these arguments (those after its name).
    Tool(fn(Vec<String>), Vec<String>),
    /// `fleet-tools --help`.
    Help,
    /// `fleet-tools --version`.
    Version,
}

/// A command line that names no tool (`fleet-tools` says so, then its help, and exits 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// Not even `argv[0]`.
    #[error("no program name")]
    NoProgramName,
    /// The first argument is not a tool's name.
    #[error("{0:?} is not one of its tools")]
    Unknown(String),
    /// `fleet-tools` alone.
    #[error("name a tool")]
    NoTool,
}

/// What to run for a command line: the tool named by the program's own name (`argv[0]`), else the one its
/// first argument names, with the arguments after that name.
pub fn select(mut args: Vec<String>) -> Result<Choice, SelectError> {
    if args.is_empty() {
        return Err(SelectError::NoProgramName);
    }
    let me = args.remove(0);
    let by_name = |n: &str| TOOLS.iter().find(|(name, _)| *name == n).map(|t| t.1);
    if let Some(tool) = Path::new(&me)
        .file_name()
        .and_then(OsStr::to_str)
        .and_then(by_name)
    {
        return Ok(Choice::Tool(tool, args));
    }
    let first = args.first().cloned();
    match first.as_deref() {
        Some(n) => match by_name(n) {
            Some(tool) => Ok(Choice::Tool(tool, args.split_off(1))),
            None if n == "--help" || n == "-h" => Ok(Choice::Help),
            None if n == "--version" || n == "-V" => Ok(Choice::Version),
            None => Err(SelectError::Unknown(n.to_string())),
        },
        None => Err(SelectError::NoTool),
    }
}

/// The multicall binary's `main`.
pub fn main() {
    match select(std::env::args().collect()) {
        Ok(Choice::Tool(tool, args)) => tool(args),
        Ok(Choice::Help) => println!("{HELP}"),
        Ok(Choice::Version) => println!("{}", env!("CARGO_PKG_VERSION")),
        Err(e) => {
            eprintln!("fleet-tools: {e}\n\n{HELP}");
            std::process::exit(2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picked(args: &[&str]) -> Result<(usize, Vec<String>), String> {
        let Choice::Tool(tool, rest) =
            select(args.iter().map(|s| s.to_string()).collect()).map_err(|e| e.to_string())?
        else {
            return Err(String::new());
        };
        let i = TOOLS
            .iter()
            .position(|t| t.1 as usize == tool as usize)
            .ok_or("not a tool")?;
        Ok((i, rest))
    }

    #[test]
    fn the_name_or_the_first_argument_picks_the_tool() {
        let ok = |i: usize, rest: &[&str]| Ok((i, rest.iter().map(|s| s.to_string()).collect()));
        // Started through a link: the link's name, every argument its own.
        assert_eq!(
            picked(&["/usr/local/sbin/fleet-token", "--config", "x"]),
            ok(2, &["--config", "x"])
        );
        assert_eq!(picked(&["fleet-fetch"]), ok(0, &[]));
        // The link's name wins over an argument that looks like a tool.
        assert_eq!(
            picked(&["fleet-reboot", "fleet-token"]),
            ok(1, &["fleet-token"])
        );
        // By the first argument.
        assert_eq!(
            picked(&["fleet-tools", "fleet-boot-watchdog", "--help"]),
            ok(3, &["--help"])
        );
        assert_eq!(picked(&["/x/fleet-tools", "fleet-reboot"]), ok(1, &[]));
        // Anything else is refused, naming what was wrong.
        assert!(picked(&["fleet-tools"]).is_err_and(|e| e.contains("name a tool")));
        assert!(picked(&["fleet-tools", "sh", "-c"]).is_err_and(|e| e.contains("\"sh\"")));
        assert!(matches!(
            select(vec!["fleet-tools".into(), "--help".into()]),
            Ok(Choice::Help)
        ));
        assert!(matches!(
            select(vec!["fleet-tools".into(), "-V".into()]),
            Ok(Choice::Version)
        ));
        assert!(picked(&[]).is_err());
        // A name is matched whole, not as a prefix or with a suffix.
        assert!(picked(&["fleet-fetch.old"]).is_err());
        assert!(picked(&["fleet-tools", "fleet-fetc"]).is_err());
    }
}
