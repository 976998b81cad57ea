//! Why a TLS connection failed, as kinds a program can explain: one classifier for every client in the tree (the
//! agent's NATS client, the operator's and its services' async NATS, the reboot client's HTTPS), chosen by the
//! error's type along its source chain — never by its text, which differs between libraries and versions.

use std::error::Error;
use std::io;

/// A TLS problem an operator fixes by configuration: a CA, a host name, a clock, a client certificate, a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsProblem {
    /// The server's certificate does not chain to a trusted CA (or its signature is bad).
    UnknownIssuer,
    /// The server's certificate is not valid for the host name or address connected to.
    WrongName,
    /// The server's certificate has expired.
    Expired,
    /// The server's certificate is not valid yet (often: the client's clock is behind).
    NotValidYet,
    /// The server requires a client certificate and none was sent.
    ClientCertRequired,
    /// The server does not speak TLS (a plain server); there is no plain fallback.
    NotTls,
}

/// The first TLS problem along `e`'s chain: each error's `source()`, and an `io::Error`'s inner error too (its
/// `source()` skips that one).
pub fn find(e: &(dyn Error + 'static)) -> Option<TlsProblem> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return classify(r);
        }
        if let Some(inner) = e.downcast_ref::<io::Error>().and_then(|io| io.get_ref()) {
            if let Some(p) = find(inner) {
                return Some(p);
            }
        }
        next = e.source();
    }
    None
}

/// The kind of one rustls error, if an operator can fix it.
pub fn classify(e: &rustls::Error) -> Option<TlsProblem> {
    use rustls::CertificateError as C;
    use TlsProblem::*;
    Some(match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::UnknownIssuer | C::BadSignature => UnknownIssuer,
            C::NotValidForName | C::NotValidForNameContext { .. } => WrongName,
            C::Expired | C::ExpiredContext { .. } => Expired,
            C::NotValidYet | C::NotValidYetContext { .. } => NotValidYet,
            _ => return None,
        },
        rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired) => {
            ClientCertRequired
        }
        // What a TLS client reads when the other end answers in plain text.
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => NotTls,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::CertificateError as C;

    /// An error that wraps another, as async-nats' and other libraries' errors do.
    #[derive(Debug)]
    struct Outer(io::Error);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "connect: {}", self.0)
        }
    }
    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn kinds_are_found_through_io_errors_and_source_chains() {
        for (e, want) in [
            (
                rustls::Error::InvalidCertificate(C::UnknownIssuer),
                TlsProblem::UnknownIssuer,
            ),
            (
                rustls::Error::InvalidCertificate(C::BadSignature),
                TlsProblem::UnknownIssuer,
            ),
            (
                rustls::Error::InvalidCertificate(C::NotValidForName),
                TlsProblem::WrongName,
            ),
            (
                rustls::Error::InvalidCertificate(C::Expired),
                TlsProblem::Expired,
            ),
            (
                rustls::Error::InvalidCertificate(C::NotValidYet),
                TlsProblem::NotValidYet,
            ),
            (
                rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
                TlsProblem::ClientCertRequired,
            ),
            (
                rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
                TlsProblem::NotTls,
            ),
        ] {
            let text = e.to_string();
            assert_eq!(classify(&e), Some(want), "{text}");
            let outer = Outer(io::Error::new(io::ErrorKind::InvalidData, e));
            assert_eq!(find(&outer), Some(want), "{outer}");
        }
        // Not a TLS problem, whatever the words say.
        let revoked = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(C::Revoked),
        );
        let words = io::Error::new(io::ErrorKind::ConnectionRefused, "UnknownIssuer");
        assert_eq!(find(&revoked), None);
        assert_eq!(find(&Outer(words)), None);
        assert_eq!(find(&io::Error::from(io::ErrorKind::TimedOut)), None);
    }
}
