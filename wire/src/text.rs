//! Bounded values: detail and error text of at most 1,024 characters, and at most 16 retained transitions; and
//! [`for_log`], how a text that came from a device or a client is shown in a log line.

use crate::limits::{MAX_TEXT_CHARS, MAX_TRANSITIONS};
use crate::ValidationError;
use serde::{Deserialize, Deserializer, Serialize};

/// Text of at most [`MAX_TEXT_CHARS`] characters with no control characters other than newline and tab.
///
/// [`BoundedText::lossy`] shortens and cleans any text (for errors raised locally); deserialization rejects
/// text over the bound, so a hostile peer cannot make us store more.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BoundedText(String);

impl BoundedText {
    /// Cleans and, if needed, shortens `s` to fit (ending in `…`).
    pub fn lossy(s: impl AsRef<str>) -> Self {
        let cleaned = s.as_ref().chars().map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '\u{fffd}'
            } else {
                c
            }
        });
        let mut out: String = cleaned.take(MAX_TEXT_CHARS + 1).collect();
        if out.chars().count() > MAX_TEXT_CHARS {
            out = out.chars().take(MAX_TEXT_CHARS - 1).collect();
            out.push('…');
        }
        Self(out)
    }
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for BoundedText {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, ValidationError> {
        if s.chars().count() > MAX_TEXT_CHARS {
            return Err(ValidationError::new(
                "text",
                format!("is longer than {MAX_TEXT_CHARS} characters"),
            ));
        }
        if s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
            return Err(ValidationError::new("text", "contains control characters"));
        }
        Ok(Self(s))
    }
}

impl From<BoundedText> for String {
    fn from(t: BoundedText) -> String {
        t.0
    }
}

impl std::fmt::Display for BoundedText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Characters of a foreign text [`for_log`] shows at most; the rest is cut (ending in `…`).
pub const LOG_TEXT_MAX_CHARS: usize = 512;

/// `text` (which came from a device, a client or another peer) made safe for one log line: at most
/// [`LOG_TEXT_MAX_CHARS`] characters, every control character escaped as Rust does (a newline shows as `\n`, a
/// carriage return as `\r`, others as `\u{..}`), and so are the characters that move or hide text (Unicode line
/// and paragraph separators, bidirectional overrides and isolates) and the backslash itself (`\\`), so a sender
/// can neither start a forged line nor pass its own `\n` off as an escape. Quotes and other printable characters
/// are kept as they are.
pub fn for_log(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(LOG_TEXT_MAX_CHARS * 4));
    let mut chars = text.chars();
    for c in chars.by_ref().take(LOG_TEXT_MAX_CHARS) {
        let hides = matches!(c, '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}')
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c);
        if c == '\\' {
            out.push_str("\\\\");
        } else if c.is_control() {
            out.extend(c.escape_debug());
        } else if hides {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// The most recent transitions, at most [`MAX_TRANSITIONS`]; pushing beyond drops the oldest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Transitions<T>(Vec<T>);

impl<T> Default for Transitions<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<T> Transitions<T> {
    /// Appends `t`, dropping the oldest entries beyond the bound.
    pub fn push(&mut self, t: T) {
        self.0.push(t);
        if self.0.len() > MAX_TRANSITIONS {
            let excess = self.0.len() - MAX_TRANSITIONS;
            self.0.drain(..excess);
        }
    }
    /// Oldest first.
    pub fn as_slice(&self) -> &[T] {
        &self.0
    }
    /// The newest transition.
    pub fn last(&self) -> Option<&T> {
        self.0.last()
    }
    /// Number retained.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// True when none are retained.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Transitions<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Vec::<T>::deserialize(d)?;
        if v.len() > MAX_TRANSITIONS {
            return Err(serde::de::Error::custom(format!(
                "more than {MAX_TRANSITIONS} transitions"
            )));
        }
        Ok(Self(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_text_in_a_log_line_is_one_line_bounded_and_unambiguous() {
        assert_eq!(for_log("plain \"quoted\" text"), "plain \"quoted\" text");
        assert_eq!(
            for_log("x`\nflood guard: device dev-b\r\u{1b}[2J\t"),
            "x`\\nflood guard: device dev-b\\r\\u{1b}[2J\\t"
        );
        assert_eq!(
            for_log("a\\nb"),
            "a\\\\nb",
            "a typed backslash-n is not a newline's escape"
        );
        assert_eq!(for_log("a\u{2028}b\u{202e}c"), "a\\u{2028}b\\u{202e}c");
        let long = for_log(&"y".repeat(10 * LOG_TEXT_MAX_CHARS));
        assert_eq!(long.chars().count(), LOG_TEXT_MAX_CHARS + 1);
        assert!(long.ends_with('…'));
        assert_eq!(
            for_log(&"y".repeat(LOG_TEXT_MAX_CHARS)).chars().count(),
            LOG_TEXT_MAX_CHARS
        );
        for c in (0u32..0x3000).filter_map(char::from_u32) {
            let shown = for_log(&c.to_string());
            assert!(
                !shown.chars().any(char::is_control),
                "{c:?} shown as {shown:?}"
            );
        }
    }

    #[test]
    fn text_is_bounded_and_clean() {
        let t = BoundedText::lossy("x".repeat(5000));
        assert_eq!(t.as_str().chars().count(), MAX_TEXT_CHARS);
        assert!(t.as_str().ends_with('…'));
        assert_eq!(
            BoundedText::lossy("a\u{1b}[31mb\nc").as_str(),
            "a\u{fffd}[31mb\nc"
        );
        assert!(BoundedText::try_from("y".repeat(1025)).is_err());
        assert!(BoundedText::try_from("y".repeat(1024)).is_ok());
        assert!(BoundedText::try_from("bell\u{7}".to_string()).is_err());
    }

    #[test]
    fn transitions_keep_the_newest_sixteen() {
        let mut t = Transitions::default();
        for i in 0..40 {
            t.push(i);
        }
        assert_eq!(t.as_slice(), (24..40).collect::<Vec<_>>().as_slice());
        let json = serde_json::to_string(&(0..17).collect::<Vec<i32>>()).expect("json");
        assert!(serde_json::from_str::<Transitions<i32>>(&json).is_err());
    }
}
