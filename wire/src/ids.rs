//! Validated identifiers: device id, attempt id (UUID), version, architecture, SHA-256, systemd 128-bit ids.
//!
//! Each is a newtype whose only constructors validate, so a value of the type is safe to use as a NATS subject
//! token, a KV key, a Kubernetes name or a path component, as its documentation says.

use crate::error::shown;
use crate::ValidationError;
use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! string_newtype {
    ($name:ident, $check:path) => {
        impl TryFrom<String> for $name {
            type Error = ValidationError;
            fn try_from(s: String) -> Result<Self, ValidationError> {
                $check(&s)?;
                Ok(Self(s))
            }
        }
        impl TryFrom<&str> for $name {
            type Error = ValidationError;
            fn try_from(s: &str) -> Result<Self, ValidationError> {
                Self::try_from(s.to_owned())
            }
        }
        impl std::str::FromStr for $name {
            type Err = ValidationError;
            fn from_str(s: &str) -> Result<Self, ValidationError> {
                Self::try_from(s.to_owned())
            }
        }
        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }
        impl $name {
            /// The validated text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

/// Longest device id in characters (a DNS-1123 label).
pub const DEVICE_ID_MAX_CHARS: usize = 63;

/// A device id: a DNS-1123 label (`a-z`, `0-9`, `-`; starts and ends alphanumeric; 1–63 characters).
///
/// That makes it safe, unchanged, as a NATS subject token and KV key (no `.`, `*`, `>`, whitespace or control
/// characters), a Kubernetes object name, a label value and a file name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DeviceId(String);
string_newtype!(DeviceId, check_device_id);

fn check_device_id(s: &str) -> Result<(), ValidationError> {
    let err = |why: &str| {
        Err(ValidationError::new(
            "device id",
            format!("{} {why}", shown(s)),
        ))
    };
    if s.is_empty() {
        return err("is empty");
    }
    if s.chars().count() > DEVICE_ID_MAX_CHARS {
        return err(&format!("is longer than {DEVICE_ID_MAX_CHARS} characters"));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return err(&format!(
            "contains {:?}; only lowercase letters, digits and '-' are allowed (safe in NATS subjects, KV keys and Kubernetes names)",
            c
        ));
    }
    if s.starts_with('-') || s.ends_with('-') {
        return err("must start and end with a letter or digit");
    }
    Ok(())
}

/// An attempt id: a UUID in lowercase hyphenated form. For system upgrades it is also the task run's UID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AttemptId(uuid::Uuid);

impl AttemptId {
    /// A fresh random (v4) id.
    pub fn new_random() -> Self {
        Self(uuid::Uuid::new_v4())
    }
    /// The UUID.
    pub fn uuid(&self) -> uuid::Uuid {
        self.0
    }
}

impl TryFrom<String> for AttemptId {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, ValidationError> {
        s.parse()
    }
}
impl TryFrom<&str> for AttemptId {
    type Error = ValidationError;
    fn try_from(s: &str) -> Result<Self, ValidationError> {
        s.parse()
    }
}
impl std::str::FromStr for AttemptId {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, ValidationError> {
        // Only the canonical form, so one attempt has exactly one spelling in keys and journals.
        let parsed = uuid::Uuid::try_parse(s)
            .ok()
            .filter(|u| u.hyphenated().to_string() == s && !u.is_nil());
        parsed.map(Self).ok_or_else(|| {
            ValidationError::new(
                "attempt id",
                format!("{} is not a lowercase hyphenated, non-nil UUID", shown(s)),
            )
        })
    }
}
impl From<AttemptId> for String {
    fn from(v: AttemptId) -> String {
        v.to_string()
    }
}
impl fmt::Display for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}

/// Longest version in characters.
pub const VERSION_MAX_CHARS: usize = 64;

/// An agent version: `MAJOR.MINOR.PATCH` with optional semver pre-release and build parts.
///
/// Safe as a path component: it is what names `/usr/lib/harmony-fleet/fleet-agent-v<version>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Version(String);
string_newtype!(Version, check_version);

fn check_version(s: &str) -> Result<(), ValidationError> {
    let err = |why: &str| {
        Err(ValidationError::new(
            "version",
            format!("{} {why}", shown(s)),
        ))
    };
    if s.is_empty() || s.len() > VERSION_MAX_CHARS {
        return err(&format!("must be 1 to {VERSION_MAX_CHARS} characters"));
    }
    let (core, rest) = match s.find(['-', '+']) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let numbers: Vec<&str> = core.split('.').collect();
    let numeric =
        |p: &&str| !p.is_empty() && p.len() <= 10 && p.bytes().all(|b| b.is_ascii_digit());
    if numbers.len() != 3 || !numbers.iter().all(numeric) {
        return err("must start with MAJOR.MINOR.PATCH, e.g. 1.4.2");
    }
    // Pre-release (-...) then build (+...): dot-separated, non-empty identifiers of [0-9A-Za-z-].
    let mut parts = rest.splitn(2, '+');
    let pre = parts.next().unwrap_or("");
    let build = parts.next();
    let idents_ok = |p: &str| {
        p.split('.')
            .all(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    if let Some(pre) = pre.strip_prefix('-') {
        if !idents_ok(pre) {
            return err("has an invalid pre-release part (dot-separated [0-9A-Za-z-] identifiers)");
        }
    } else if !pre.is_empty() {
        return err("is not a semver version");
    }
    if let Some(build) = build {
        if !idents_ok(build) {
            return err("has an invalid build part (dot-separated [0-9A-Za-z-] identifiers)");
        }
    }
    Ok(())
}

/// A CPU architecture, in Debian's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// x86-64 (Debian on PCs and servers).
    Amd64,
    /// AArch64 (Raspberry Pi OS 64-bit).
    Arm64,
}

impl Architecture {
    /// The architecture this program was compiled for, if it is one the fleet supports.
    pub fn current() -> Option<Self> {
        if cfg!(target_arch = "x86_64") {
            Some(Self::Amd64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Self::Arm64)
        } else {
            None
        }
    }
    /// Debian's name: `amd64` or `arm64`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Amd64 => "amd64",
            Self::Arm64 => "arm64",
        }
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A SHA-256 digest as 64 lowercase hexadecimal digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Sha256Hex(String);
string_newtype!(Sha256Hex, check_sha256);

fn check_sha256(s: &str) -> Result<(), ValidationError> {
    if s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(ValidationError::new(
            "sha256",
            format!("{} is not 64 lowercase hexadecimal digits", shown(s)),
        ))
    }
}

impl Sha256Hex {
    /// Hex-encodes a 32-byte digest.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// A systemd 128-bit id (boot id, invocation id, machine id) as 32 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Id128(String);
string_newtype!(Id128, check_id128);

fn check_id128(s: &str) -> Result<(), ValidationError> {
    if s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(ValidationError::new(
            "systemd id",
            format!("{} is not 32 lowercase hexadecimal digits", shown(s)),
        ))
    }
}

impl Id128 {
    /// Parses the UUID form in `/proc/sys/kernel/random/boot_id` (hyphens removed) or the plain 32-digit form.
    pub fn parse_lenient(s: &str) -> Result<Self, ValidationError> {
        let plain: String = s.trim().chars().filter(|c| *c != '-').collect();
        Self::try_from(plain.to_ascii_lowercase())
    }
}

/// Longest systemd unit name we carry.
pub const UNIT_NAME_MAX_CHARS: usize = 256;

/// A systemd unit name such as `fleet-updater.service` (the one journald reference a status carries).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UnitName(String);
string_newtype!(UnitName, check_unit_name);

fn check_unit_name(s: &str) -> Result<(), ValidationError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || ":_.@-\\".contains(c);
    if !s.is_empty() && s.len() <= UNIT_NAME_MAX_CHARS && s.chars().all(ok_char) && s.contains('.')
    {
        Ok(())
    } else {
        Err(ValidationError::new(
            "unit name",
            format!("{} is not a systemd unit name", shown(s)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_ids() {
        for ok in ["device-1", "a", "rpi4-0042", &"a".repeat(63)] {
            assert!(DeviceId::try_from(ok).is_ok(), "{ok}");
        }
        for bad in [
            "a.b",
            "a*",
            ">",
            " ",
            "",
            &"a".repeat(300),
            "Dev",
            "a_b",
            "-a",
            "a-",
            "a\u{0}",
            "a\nb",
            "é",
        ] {
            let e = DeviceId::try_from(bad).expect_err(bad);
            assert_eq!(e.field, "device id");
            assert!(e.to_string().starts_with("invalid device id: "), "{e}");
        }
    }

    #[test]
    fn attempt_ids() {
        assert!(AttemptId::try_from("6f1c2b9e-8d0a-4c55-9a77-3f2e1d0c9b8a").is_ok());
        for bad in [
            "",
            "not-a-uuid",
            "6F1C2B9E-8D0A-4C55-9A77-3F2E1D0C9B8A",
            "6f1c2b9e8d0a4c559a773f2e1d0c9b8a",
            "{6f1c2b9e-8d0a-4c55-9a77-3f2e1d0c9b8a}",
            "00000000-0000-0000-0000-000000000000",
            "6f1c2b9e-8d0a-4c55-9a77-3f2e1d0c9b8",
        ] {
            assert!(AttemptId::try_from(bad).is_err(), "{bad}");
        }
        let id = AttemptId::new_random();
        assert_eq!(AttemptId::try_from(id.to_string()), Ok(id));
    }

    #[test]
    fn versions() {
        for ok in [
            "1.0.0",
            "0.12.3-rc.1",
            "1.2.3+build.5",
            "1.2.3-alpha-1+x",
            "10.20.30",
        ] {
            assert!(Version::try_from(ok).is_ok(), "{ok}");
        }
        for bad in [
            "../x",
            "1.0/../../etc",
            "",
            "1.0",
            "1.0.0.0",
            "v1.0.0",
            "1.0.0-",
            "1.0.0-a..b",
            "1.0.0/x",
            "1.0.0 ",
            "1.0.0-rc/1",
            ".1.0.0",
            "1.0.0+",
            &format!("1.0.0-{}", "a".repeat(70)),
        ] {
            assert!(Version::try_from(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sha256_and_ids() {
        assert!(Sha256Hex::try_from("a".repeat(64)).is_ok());
        for bad in [
            "a".repeat(63),
            "a".repeat(65),
            "A".repeat(64),
            "g".repeat(64),
            String::new(),
        ] {
            assert!(Sha256Hex::try_from(bad.clone()).is_err(), "{bad}");
        }
        assert_eq!(Sha256Hex::from_bytes([0xab; 32]).as_str(), "ab".repeat(32));
        let boot = Id128::parse_lenient("6F1C2B9E-8D0A-4C55-9A77-3F2E1D0C9B8A\n").expect("boot id");
        assert_eq!(boot.as_str(), "6f1c2b9e8d0a4c559a773f2e1d0c9b8a");
        assert!(UnitName::try_from("fleet-updater.service").is_ok());
        assert!(UnitName::try_from("fleet updater").is_err());
    }
}
