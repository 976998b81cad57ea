//! The command line of every program of the tree (agent, updater and its helpers, operator, fleetlock-server,
//! fleet-auth): `--help`/`-h`, `--version`/`-V`, on/off flags and options that take one value (the next
//! argument); nothing else — no bundling, no `--opt=value`, no positional arguments (a program with a subcommand
//! takes it off before). Each program keeps its own help text and how it reports an error.

use std::path::PathBuf;

/// What a program accepts besides `--help` and `--version`.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// On/off flags (`--self-test`).
    pub flags: &'static [&'static str],
    /// Options followed by one value (`--config PATH`).
    pub options: &'static [&'static str],
}

/// A program whose only option is `--config PATH`.
pub const CONFIG_ONLY: Spec = Spec {
    flags: &[],
    options: &["--config"],
};

/// What a command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Cli {
    /// Print the help text and exit 0.
    Help,
    /// Print the version and exit 0.
    Version,
    /// Run with these flags and options.
    Run(Args),
}

/// The flags and options given, in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Args {
    given: Vec<(&'static str, Option<String>)>,
}

impl Args {
    /// True when flag `name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.given.iter().any(|(n, v)| *n == name && v.is_none())
    }

    /// The flags given, in the order given.
    pub fn flags(&self) -> Vec<&'static str> {
        self.given
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| *n)
            .collect()
    }

    /// The value of option `name`, the last one when given more than once.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.given
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// [`Self::value`] as a path.
    pub fn path(&self, name: &str) -> Option<PathBuf> {
        self.value(name).map(PathBuf::from)
    }

    /// Every option given with its value, in the order given.
    pub fn options(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.given
            .iter()
            .filter_map(|(n, v)| v.as_deref().map(|v| (*n, v)))
    }
}

impl Cli {
    /// Parses `args` (without the program name). `Err` names an unknown argument or an option without its value.
    pub fn parse(args: impl IntoIterator<Item = String>, spec: &Spec) -> Result<Self, String> {
        let mut given = Vec::new();
        let mut args = args.into_iter();
        while let Some(a) = args.next() {
            match a.as_str() {
                "--help" | "-h" => return Ok(Self::Help),
                "--version" | "-V" => return Ok(Self::Version),
                other => {
                    if let Some(f) = spec.flags.iter().find(|f| **f == other) {
                        given.push((*f, None));
                    } else if let Some(o) = spec.options.iter().find(|o| **o == other) {
                        match args.next() {
                            Some(v) => given.push((*o, Some(v))),
                            None => return Err(format!("{o} needs a value (see --help)")),
                        }
                    } else {
                        return Err(format!("unknown argument {other:?} (see --help)"));
                    }
                }
            }
        }
        Ok(Self::Run(Args { given }))
    }

    /// The process's own command line: prints `help` or the version (`version`) and exits 0 for those; `Err`
    /// as [`Self::parse`]; otherwise what was given.
    pub fn from_env(help: &str, version: &str, spec: &Spec) -> Result<Args, String> {
        Self::from_args(std::env::args().skip(1), help, version, spec)
    }

    /// For a program whose only option is `--config PATH` ([`CONFIG_ONLY`]): that path, else `default`; `--help`
    /// and `--version` as [`Self::from_args`].
    pub fn config_only(
        args: impl IntoIterator<Item = String>,
        help: &str,
        version: &str,
        default: &str,
    ) -> Result<PathBuf, String> {
        Ok(Self::from_args(args, help, version, &CONFIG_ONLY)?
            .path("--config")
            .unwrap_or_else(|| default.into()))
    }

    /// [`Self::from_env`] for arguments already taken (after a subcommand).
    pub fn from_args(
        args: impl IntoIterator<Item = String>,
        help: &str,
        version: &str,
        spec: &Spec,
    ) -> Result<Args, String> {
        match Self::parse(args, spec)? {
            Self::Help => {
                println!("{help}");
                std::process::exit(0)
            }
            Self::Version => {
                println!("{version}");
                std::process::exit(0)
            }
            Self::Run(args) => Ok(args),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines() {
        const SPEC: Spec = Spec {
            flags: &["--check", "--plain-http"],
            options: &["--config", "--listen"],
        };
        let parse = |args: &[&str]| Cli::parse(args.iter().map(|a| a.to_string()), &SPEC);
        let Ok(Cli::Run(a)) = parse(&[]) else {
            panic!("empty")
        };
        assert_eq!((a.flags(), a.value("--config")), (vec![], None));
        let Ok(Cli::Run(a)) = parse(&[
            "--config", "/tmp/y", "--check", "--listen", ":1", "--config", "/tmp/z",
        ]) else {
            panic!("run")
        };
        assert_eq!(a.flags(), ["--check"]);
        assert!(a.flag("--check") && !a.flag("--plain-http") && !a.flag("--config"));
        assert_eq!(
            a.path("--config"),
            Some(PathBuf::from("/tmp/z")),
            "the last wins"
        );
        assert_eq!(
            a.options().collect::<Vec<_>>(),
            [
                ("--config", "/tmp/y"),
                ("--listen", ":1"),
                ("--config", "/tmp/z")
            ]
        );
        assert_eq!(parse(&["--check", "--help"]), Ok(Cli::Help));
        assert_eq!(parse(&["-h"]), Ok(Cli::Help));
        assert_eq!(parse(&["--version"]), Ok(Cli::Version));
        assert_eq!(parse(&["-V"]), Ok(Cli::Version));
        assert_eq!(
            parse(&["--config"]),
            Err("--config needs a value (see --help)".into())
        );
        let e = parse(&["--after-boot"]).expect_err("not allowed here");
        assert_eq!(e, "unknown argument \"--after-boot\" (see --help)");
        // A flag is not an option: no value is taken after it.
        let e = parse(&["--check", "x"]).expect_err("positional");
        assert!(e.contains("\"x\""), "{e}");
    }
}
