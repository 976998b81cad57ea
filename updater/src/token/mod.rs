//! The device token refresher (`fleet-token`, a oneshot run by `fleet-token.timer`): gets a fresh NATS token for
//! the device as its Zitadel machine user with the JWT-profile grant (RFC 7523: an assertion signed with the
//! machine key, POSTed to the token endpoint) and replaces the token file the agent reads on every connection
//! (docs/auth.md). A failure leaves the old token in place.

pub mod assertion;
pub mod cli;
pub mod config;
pub mod grant;
pub mod store;

pub use config::TokenConfig;

/// What one refresh did (no token in it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refreshed {
    /// The machine user the token was issued to.
    pub user_id: String,
    /// The new token's lifetime in seconds, when the endpoint said.
    pub expires_in: Option<u64>,
}

/// A refresh that wrote no token (the old one stays): the key, the endpoint or the token file.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The machine key file could not be read.
    #[error(transparent)]
    ReadKey(#[from] crate::bounded::ReadError),
    /// The machine key file (named) cannot be used.
    #[error("{}: {source}", path.display())]
    Key {
        /// The key file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        source: assertion::KeyError,
    },
    /// The assertion could not be signed.
    #[error(transparent)]
    Sign(assertion::KeyError),
    /// The token endpoint issued no token.
    #[error(transparent)]
    Grant(#[from] grant::GrantError),
    /// The token file could not be replaced.
    #[error(transparent)]
    Store(#[from] store::StoreError),
}

/// Reads the machine key, asks the token endpoint for a token and writes it to the token file. `now` is the
/// current Unix time in seconds.
pub fn refresh(cfg: &TokenConfig, now: u64) -> Result<Refreshed, TokenError> {
    let key_path = cfg.key_file();
    let key_json = crate::bounded::read(&key_path, KEY_FILE_MAX_BYTES)?;
    let key = assertion::MachineKey::parse(&key_json).map_err(|source| TokenError::Key {
        path: key_path.clone(),
        source,
    })?;
    let jwt = key
        .assertion(cfg.audience(), now)
        .map_err(TokenError::Sign)?;
    let issued = grant::request(
        &cfg.token_endpoint(),
        &jwt,
        &cfg.scope(),
        cfg.ca_file.as_deref(),
        cfg.timeout(),
    )?;
    store::write_token(&cfg.token_file(), &issued.token)?;
    Ok(Refreshed {
        user_id: key.user_id().to_string(),
        expires_in: issued.expires_in,
    })
}

/// The largest machine key file read, in bytes (a 4096-bit key's JSON is about 3.5 KiB).
const KEY_FILE_MAX_BYTES: u64 = 16 * 1024;
