//! Why a connection attempt failed, as kinds a caller can act on. The errors stay `io::Error`s (their text is
//! unchanged), but they carry their cause as a typed inner error (rustls' own, or the server list's), so that a
//! caller can tell an operator which file or clock to fix without reading the text.

use std::fmt;
use std::io;

pub use fleet_wire::tls_problem::TlsProblem;

/// The TLS problem behind `e`, if it is one: the first attempt that had one when several servers were tried.
pub fn tls_problem(e: &io::Error) -> Option<TlsProblem> {
    let inner = e.get_ref()?;
    if let Some(a) = inner.downcast_ref::<Attempts>() {
        return a.0.iter().find_map(|(_, e)| tls_problem(e));
    }
    if inner.downcast_ref::<PlainServer>().is_some() {
        return Some(TlsProblem::NotTls);
    }
    fleet_wire::tls_problem::find(e)
}

/// A rustls error as an `io::Error` that keeps it.
pub(crate) fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// The server's INFO offers no TLS although TLS is configured.
#[derive(Debug)]
pub(crate) struct PlainServer(pub String);

impl fmt::Display for PlainServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TLS is required but the server at {} does not offer it (plain server; no plain fallback)",
            self.0
        )
    }
}

impl std::error::Error for PlainServer {}

/// Every server's failure, in the order tried; shown as one line (`server: error; …`, or the error alone when
/// there was one server).
#[derive(Debug)]
pub(crate) struct Attempts(pub Vec<(Option<String>, io::Error)>);

impl fmt::Display for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (server, e)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match server {
                Some(s) => write!(f, "{s}: {e}")?,
                None => write!(f, "{e}")?,
            }
        }
        Ok(())
    }
}

impl std::error::Error for Attempts {}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::CertificateError as C;

    fn tls(e: rustls::Error) -> io::Error {
        tls_error(e)
    }

    /// Which rustls error is which kind is fleet_wire::tls_problem's table; here: the kind survives the io::Error
    /// and the list of servers tried.
    #[test]
    fn kinds_survive_the_io_error_and_the_server_list() {
        for (e, want) in [
            (
                rustls::Error::InvalidCertificate(C::UnknownIssuer),
                TlsProblem::UnknownIssuer,
            ),
            (
                rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
                TlsProblem::ClientCertRequired,
            ),
        ] {
            let text = e.to_string();
            let one = tls(e);
            assert_eq!(one.to_string(), text, "the text is unchanged");
            assert_eq!(tls_problem(&one), Some(want), "{text}");
            let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
            let many = io::Error::new(
                io::ErrorKind::InvalidData,
                Attempts(vec![
                    (Some("nats://a:4222".into()), refused),
                    (Some("tls://b:4222".into()), one),
                ]),
            );
            assert_eq!(tls_problem(&many), Some(want), "{many}");
            assert_eq!(
                many.to_string(),
                format!("nats://a:4222: connection refused; tls://b:4222: {text}")
            );
        }
        let plain = io::Error::new(
            io::ErrorKind::InvalidData,
            PlainServer("nats://h:4222".into()),
        );
        assert_eq!(tls_problem(&plain), Some(TlsProblem::NotTls));
        assert!(plain.to_string().contains("does not offer it"));
        // Not a TLS problem: nothing to explain, whatever the words say.
        for e in [
            io::Error::new(io::ErrorKind::ConnectionRefused, "UnknownIssuer"),
            tls(rustls::Error::InvalidCertificate(C::Revoked)),
            io::Error::from(io::ErrorKind::TimedOut),
        ] {
            assert_eq!(tls_problem(&e), None, "{e}");
        }
    }
}
