//! The candidate's executable check before the probe: an ELF executable for this device's architecture, so that
//! a script or a blob is never run (exec of a non-ELF falls back to `/bin/sh`) and an arm64 binary is not tried
//! on amd64. Pure header check plus one bounded read.

use fleet_wire::Architecture;
use std::io::Read;
use std::path::Path;

/// Bytes of the ELF header this check reads.
pub const HEADER_BYTES: usize = 20;

const ET_EXEC: u16 = 2;
const ET_DYN: u16 = 3;
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

/// The ELF machine number of `arch`.
fn machine(arch: Architecture) -> u16 {
    match arch {
        Architecture::Amd64 => EM_X86_64,
        Architecture::Arm64 => EM_AARCH64,
    }
}

/// Why a header is not an executable for this device: a short printable sentence that follows the file's name
/// (it never quotes the bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Not ELF at all (a script, an archive, a blob).
    #[error("is not an ELF executable (a script or another file format is never run)")]
    NotElf,
    /// ELF, but not 64-bit little-endian.
    #[error("is not a 64-bit little-endian ELF executable")]
    NotLittle64,
    /// ELF of a type other than an executable (a shared object, a core file…).
    #[error("is an ELF file of type {0}, not an executable")]
    NotExecutable(u16),
    /// An executable for another architecture.
    #[error("is built for {built}, this device is {device}")]
    OtherArchitecture {
        /// What it is built for (`amd64`, `arm64` or `ELF machine N`).
        built: String,
        /// This device's architecture.
        device: Architecture,
    },
}

/// The candidate cannot be run here; the text names the file.
#[derive(Debug, thiserror::Error)]
pub enum CandidateError {
    /// Its header could not be read.
    #[error("reading {}: {source}", path.display())]
    Read {
        /// The candidate.
        path: std::path::PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// It is not an executable for this device.
    #[error("the candidate {} {why}", path.display())]
    Refused {
        /// The candidate.
        path: std::path::PathBuf,
        /// Why.
        why: HeaderError,
    },
}

/// Checks an ELF header: 64-bit, little-endian, an executable or position-independent executable, for `arch`.
/// The error is a short printable sentence (it never quotes the bytes).
pub fn check_header(header: &[u8], arch: Architecture) -> Result<(), HeaderError> {
    if header.len() < HEADER_BYTES || header[..4] != *b"\x7fELF" {
        return Err(HeaderError::NotElf);
    }
    if header[4] != 2 || header[5] != 1 {
        return Err(HeaderError::NotLittle64);
    }
    let e_type = u16::from_le_bytes([header[16], header[17]]);
    if e_type != ET_EXEC && e_type != ET_DYN {
        return Err(HeaderError::NotExecutable(e_type));
    }
    let e_machine = u16::from_le_bytes([header[18], header[19]]);
    if e_machine != machine(arch) {
        let what = match e_machine {
            EM_X86_64 => "amd64".to_owned(),
            EM_AARCH64 => "arm64".to_owned(),
            m => format!("ELF machine {m}"),
        };
        return Err(HeaderError::OtherArchitecture {
            built: what,
            device: arch,
        });
    }
    Ok(())
}

/// Checks the file at `path` for `arch`; the error names the file.
pub fn check_file(path: &Path, arch: Architecture) -> Result<(), CandidateError> {
    let mut header = Vec::with_capacity(HEADER_BYTES);
    std::fs::File::open(path)
        .and_then(|f| f.take(HEADER_BYTES as u64).read_to_end(&mut header))
        .map_err(|source| CandidateError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    check_header(&header, arch).map_err(|why| CandidateError::Refused {
        path: path.to_path_buf(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(class: u8, data: u8, e_type: u16, machine: u16) -> Vec<u8> {
        let mut h = b"\x7fELF".to_vec();
        h.extend([class, data, 1, 0]);
        h.extend([0; 8]);
        h.extend(e_type.to_le_bytes());
        h.extend(machine.to_le_bytes());
        h
    }

    #[test]
    fn table() {
        use Architecture::*;
        let cases: [(Vec<u8>, Architecture, Option<&str>); 9] = [
            (header(2, 1, ET_DYN, EM_X86_64), Amd64, None),
            (header(2, 1, ET_EXEC, EM_AARCH64), Arm64, None),
            (
                header(2, 1, ET_DYN, EM_AARCH64),
                Amd64,
                Some("built for arm64"),
            ),
            (
                header(2, 1, ET_DYN, EM_X86_64),
                Arm64,
                Some("built for amd64"),
            ),
            (header(2, 1, ET_DYN, 40), Arm64, Some("ELF machine 40")),
            (header(1, 1, ET_DYN, EM_X86_64), Amd64, Some("64-bit")),
            (
                header(2, 2, ET_DYN, EM_X86_64),
                Amd64,
                Some("little-endian"),
            ),
            (header(2, 1, 1, EM_X86_64), Amd64, Some("type 1")),
            (
                b"#!/bin/sh\necho hi\n\x01\x02\x03".to_vec(),
                Amd64,
                Some("not an ELF"),
            ),
        ];
        for (h, arch, want) in cases {
            match (check_header(&h, arch), want) {
                (Ok(()), None) => {}
                (Err(e), Some(w)) => {
                    assert!(e.to_string().contains(w), "{e}");
                    assert!(e.to_string().chars().all(|c| !c.is_control()), "{e:?}");
                }
                (got, want) => panic!("{h:?} on {arch}: got {got:?}, want {want:?}"),
            }
        }
        assert!(check_header(b"\x7fEL", Amd64).is_err());
    }

    #[test]
    fn this_test_binary_passes_for_this_device() {
        let exe = std::env::current_exe().expect("exe");
        let arch = Architecture::current().expect("supported");
        check_file(&exe, arch).expect("own binary");
    }
}
