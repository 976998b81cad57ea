//! Refusing a NATS password that is still a placeholder of the docs (`$NAME`, `${NAME}`, `$(NAME)`): copied
//! verbatim, an example must stop the service at start with the reason, never connect with a password printed
//! in public docs (nor fail later as an unexplained authorization violation).

/// `Err` with a message naming `what` (where the password came from) when `password` is a placeholder: `$`
/// followed by a variable name, bare, in braces (shell) or in parentheses (Kubernetes, which leaves `$(NAME)` as
/// it is when the variable is not defined). The placeholder is not a secret, so the message shows it.
pub fn refuse_placeholder(password: &str, what: &str) -> Result<(), String> {
    let p = password.trim();
    let Some(rest) = p.strip_prefix('$') else {
        return Ok(());
    };
    let name = rest
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .or_else(|| rest.strip_prefix('(').and_then(|r| r.strip_suffix(')')))
        .unwrap_or(rest);
    let mut chars = name.chars();
    let is_name = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !is_name {
        return Ok(());
    }
    Err(format!(
        "{what} is {p:?}, a placeholder, not a password: the variable was not substituted (a copied example?). \
         Put the password itself there, the one nats-server's configuration takes from its environment variable \
         {name}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_refused_and_passwords_pass() {
        for p in [
            "$FLEET_AUTH_PASSWORD",
            "${OPERATOR_PASSWORD}",
            "$(FLEETLOCK_PASSWORD)",
            " $pw\n",
            "$_X1",
        ] {
            let e = refuse_placeholder(p, "nats.password_file /p").expect_err(p);
            assert!(e.starts_with("nats.password_file /p is \"$"), "{e}");
            assert!(e.contains("placeholder"), "{e}");
        }
        for p in [
            "s3cret",
            "$2a$11$hash",
            "$",
            "${}",
            "$1abc",
            "p$WORD",
            "$NAME-x",
            "${NAME",
            "",
        ] {
            assert_eq!(refuse_placeholder(p, "x"), Ok(()), "{p:?}");
        }
    }
}
