//! NATS connection details every cluster-side program needs the same way.

/// The most replicas JetStream allows a stream.
pub const MAX_REPLICAS: usize = 5;

/// The servers of a comma-separated URL list (`nats://a:4222,nats://b:4222`: the nodes of a cluster), for the
/// client to fail over between; async-nats takes a single string as one server.
pub fn servers(url: &str) -> Vec<&str> {
    url.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// An error with its sources (async-nats keeps the TLS reason in the source).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_list_is_one_server_per_url() {
        assert_eq!(
            servers("nats://a:4222, nats://b:4222,,nats://c:4222 "),
            ["nats://a:4222", "nats://b:4222", "nats://c:4222"]
        );
        assert_eq!(servers("nats://a:4222"), ["nats://a:4222"]);
        // Each parses as one server address (async-nats took the whole list as one and failed).
        for s in servers("nats://127.0.0.1:4222,tls://127.0.0.1:4223") {
            s.parse::<async_nats::ServerAddr>().expect(s);
        }
    }
}
