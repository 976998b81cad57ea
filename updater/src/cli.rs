//! The command line shared by the device's small helper binaries (fleet-reboot, fleet-token,
//! fleet-boot-watchdog): `--help`, `--version`, `--config PATH` and a few on/off flags, nothing else.

use std::path::PathBuf;

/// What a command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Cli {
    /// Print the help text and exit 0.
    Help,
    /// Print the version and exit 0.
    Version,
    /// Run with this config file and these of the allowed flags.
    Run {
        /// `--config PATH`, else the binary's default.
        config: PathBuf,
        /// The allowed flags given, in the order given.
        flags: Vec<&'static str>,
    },
}

impl Cli {
    /// Parses `args` (without the program name): `flags` are the on/off options the binary knows besides
    /// `--config`; `Err` names an unknown argument or a `--config` without its path.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        default_config: &str,
        flags: &[&'static str],
    ) -> Result<Self, String> {
        let mut config = PathBuf::from(default_config);
        let mut given = Vec::new();
        let mut args = args.into_iter();
        while let Some(a) = args.next() {
            match a.as_str() {
                "--help" | "-h" => return Ok(Self::Help),
                "--version" => return Ok(Self::Version),
                "--config" => match args.next() {
                    Some(p) => config = PathBuf::from(p),
                    None => return Err("--config needs a path".into()),
                },
                other => match flags.iter().find(|f| **f == other) {
                    Some(f) => given.push(*f),
                    None => return Err(format!("unknown argument {other:?} (see --help)")),
                },
            }
        }
        Ok(Self::Run {
            config,
            flags: given,
        })
    }

    /// The process's own command line: prints the help or the version and exits 0 for those; `Err` as
    /// [`Self::parse`]; otherwise the config path and the flags given.
    pub fn from_env(
        help: &str,
        default_config: &str,
        flags: &[&'static str],
    ) -> Result<(PathBuf, Vec<&'static str>), String> {
        match Self::parse(std::env::args().skip(1), default_config, flags)? {
            Self::Help => {
                println!("{help}");
                std::process::exit(0)
            }
            Self::Version => {
                println!("{}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0)
            }
            Self::Run { config, flags } => Ok((config, flags)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines() {
        let parse = |args: &[&str]| {
            Cli::parse(
                args.iter().map(|a| a.to_string()),
                "/etc/x.toml",
                &["--check"],
            )
        };
        let run = |config: &str, flags: Vec<&'static str>| {
            Ok(Cli::Run {
                config: PathBuf::from(config),
                flags,
            })
        };
        assert_eq!(parse(&[]), run("/etc/x.toml", vec![]));
        assert_eq!(
            parse(&["--config", "/tmp/y.toml", "--check"]),
            run("/tmp/y.toml", vec!["--check"])
        );
        assert_eq!(parse(&["--check", "--help"]), Ok(Cli::Help));
        assert_eq!(parse(&["-h"]), Ok(Cli::Help));
        assert_eq!(parse(&["--version"]), Ok(Cli::Version));
        assert_eq!(parse(&["--config"]), Err("--config needs a path".into()));
        let e = parse(&["--after-boot"]).expect_err("not allowed here");
        assert!(
            e.contains("\"--after-boot\"") && e.contains("--help"),
            "{e}"
        );
    }
}
