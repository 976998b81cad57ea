//! The one validation error every constructor in this crate returns.

/// A value was rejected by a constructor; `field` names what, `reason` says why in words a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct ValidationError {
    /// The field or type that was rejected, e.g. `device id`.
    pub field: &'static str,
    /// Why it was rejected.
    pub reason: String,
}

impl ValidationError {
    /// Builds an error for `field` with `reason`.
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

/// Renders a possibly hostile input for an error message: bounded and with control characters escaped.
pub(crate) fn shown(input: &str) -> String {
    const MAX: usize = 64;
    let mut out: String = input
        .chars()
        .take(MAX)
        .flat_map(char::escape_debug)
        .collect();
    if input.chars().count() > MAX {
        out.push('…');
    }
    format!("\"{out}\"")
}
