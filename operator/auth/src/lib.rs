//! fleet-auth: the NATS auth callout. Devices connect with a Zitadel token; this service verifies it against the
//! issuer's JWKS and answers with a user JWT allowing only that device's subjects. Imports only fleet-wire and
//! its own files, never another product folder. See `docs/auth.md`.

pub mod callout;
pub mod config;
pub mod device_api;
pub mod flood;
pub mod flood_guard;
pub mod jwks;
pub mod natsjwt;
pub mod retired;
pub mod service;
pub mod token;
