//! `fleet-fetch`: the download helper the updater runs as the agent user for each agent upgrade.
//! One of the names of the `fleet-tools` multicall binary ([`crate::tools`]).

use std::io::Write;
use std::os::fd::AsFd;

const HELP: &str = "\
fleet-fetch: downloads one agent artifact for fleet-updater, so the root updater never parses TLS, HTTP or OCI
answers from an artifact server itself. fleet-updater starts it (from beside its own executable) as the agent
user with a clean environment, writes one JSON request line to its stdin, and reads the artifact's bytes from
its stdout, checking the byte limit and the SHA-256 again on its side. Not meant to be run by hand.

Usage: fleet-fetch < request.json > artifact

For a protocol-2 request the artifact's bytes follow one JSON start line saying where they begin (0, or the
resume offset the request named when the server continued those bytes with an HTTP range).
Exit status: 0 when every byte was written (and, from zero, verified); 1 after printing one JSON failure line
({\"reason\":…,\"message\":…}) on stderr. See docs/artifacts.md.";

/// The tool, given its arguments after its name.
pub fn main(args: Vec<String>) {
    if let Some(a) = args.into_iter().next() {
        match a.as_str() {
            "--help" | "-h" => println!("{HELP}"),
            "--version" | "-V" => println!("{}", env!("CARGO_PKG_VERSION")),
            other => {
                eprintln!("fleet-fetch: unknown argument {other:?}\n\n{HELP}");
                std::process::exit(2);
            }
        }
        return;
    }
    // The artifact is binary: write it through an unbuffered duplicate of fd 1, not the line-buffered stdout.
    let out = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from);
    let result = match out {
        Ok(mut out) => crate::fetch_helper::serve(std::io::stdin().lock(), &mut out),
        Err(e) => Err(fleet_wire::FetchFailure {
            reason: fleet_wire::UpgradeReason::DownloadFailed,
            message: fleet_wire::BoundedText::lossy(format!("stdout: {e}")),
            transient: false,
        }),
    };
    if let Err(f) = result {
        let line = serde_json::to_string(&f).unwrap_or_else(|_| {
            r#"{"reason":"download-failed","message":"fleet-fetch failed"}"#.into()
        });
        let _ = writeln!(std::io::stderr(), "{line}");
        std::process::exit(1);
    }
}
