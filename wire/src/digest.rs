//! Canonical content digests: SHA-256 over a domain tag and the compact JSON serialization.
//!
//! Struct fields serialize in declaration order and maps are `BTreeMap`s, so the JSON of a value is canonical;
//! the domain tag keeps a digest of one type from ever equalling a digest of another.

use crate::Sha256Hex;
use serde::Serialize;
use sha2::{Digest, Sha256};

/// SHA-256 of `domain`, a newline, and the compact JSON of `value`.
pub fn canonical_digest<T: Serialize>(domain: &str, value: &T) -> Sha256Hex {
    let mut h = Sha256::new();
    h.update(domain.as_bytes());
    h.update(b"\n");
    // Serializing a validated in-memory value to a Vec cannot fail (no maps with non-string keys are used).
    let json = serde_json::to_vec(value).unwrap_or_default();
    h.update(&json);
    Sha256Hex::from_bytes(h.finalize().into())
}
