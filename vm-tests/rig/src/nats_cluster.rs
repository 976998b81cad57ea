//! A real 3-node `nats-server` cluster with JetStream (plain, no auth): each node on free loopback client and
//! route ports with its own store directory, so a test can kill one node (SIGKILL) and start it again with the
//! same store, find the leader of a bucket's stream, wait until every replica has caught up, and see which
//! clients each node serves (its monitoring endpoint's `/connz`).

use crate::nats_client::{self, Connection};
use crate::util::{free_port, kill_when_gone};
use crate::wait::wait_for;
use crate::NatsServer;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The cluster's name (nats-server's `cluster.name`).
pub const CLUSTER_NAME: &str = "fleet";
/// How long one JetStream API request (or monitoring request) of the rig may take.
const API_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest monitoring answer read, in bytes.
const MONITOR_MAX_BYTES: u64 = 4 << 20;

/// One node: its name (`n1`…), ports, configuration, store and log, and its process while it runs.
struct Node {
    name: String,
    port: u16,
    monitor_port: u16,
    conf: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A running cluster; every node is killed on drop and the stores removed.
pub struct NatsCluster {
    binary: PathBuf,
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl NatsCluster {
    /// Starts `size` nodes (3 for R3 buckets) that route to each other, and waits until JetStream has a meta
    /// leader. Panics (failing the test) if it cannot.
    pub fn start(size: usize) -> Self {
        let binary = NatsServer::binary();
        let dir = tempfile::Builder::new()
            .prefix("fleet-nats-cluster-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for the NATS cluster: {e}"));
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, r, _)| format!("\"nats-route://127.0.0.1:{r}\""))
            .collect();
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, (port, route, monitor))| {
                let name = format!("n{}", i + 1);
                let store = dir.path().join(format!("{name}-store"));
                let conf = dir.path().join(format!("{name}.conf"));
                let log = dir.path().join(format!("{name}.log"));
                std::fs::write(
                    &conf,
                    format!(
                        "server_name: {name}\nlisten: \"127.0.0.1:{port}\"\nlog_file: \"{log}\"\n\
                         http: \"127.0.0.1:{monitor}\"\n\
                         jetstream {{ store_dir: \"{store}\" }}\n\
                         cluster {{\n  name: {CLUSTER_NAME}\n  listen: \"127.0.0.1:{route}\"\n  \
                         routes: [{routes}]\n}}\n",
                        log = log.display(),
                        store = store.display(),
                        routes = routes.join(", "),
                    ),
                )
                .unwrap_or_else(|e| panic!("write {}: {e}", conf.display()));
                Node {
                    name,
                    port: *port,
                    monitor_port: *monitor,
                    conf,
                    log,
                    child: None,
                }
            })
            .collect();
        let mut c = Self {
            binary,
            nodes,
            _dir: dir,
        };
        for i in 0..size {
            c.spawn(i);
        }
        c.wait_meta_leader(Duration::from_secs(30));
        c
    }

    fn spawn(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let mut child = Command::new(&self.binary)
            .arg("-c")
            .arg(&node.conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.binary.display()));
        kill_when_gone(&[child.id()]);
        let (port, name) = (node.port, node.name.clone());
        let up = wait_for(Duration::from_secs(15), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("nats-server {name} exited at start-up with {status} (port {port} taken?)");
            }
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
        if up.is_none() {
            let _ = child.kill();
            panic!("nats-server {name} did not accept connections on 127.0.0.1:{port} within 15 s");
        }
        node.child = Some(child);
    }

    /// How many nodes the cluster has.
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// Every node's client URL, `nats://127.0.0.1:<port>`, in node order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The client URLs comma-separated (the form `FLEET_NATS_URL` and fleetlock-server's `url` take).
    pub fn url_list(&self) -> String {
        self.urls().join(",")
    }

    /// Every node's client port, in node order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Node `i`'s server name (`n1`…).
    pub fn name(&self, i: usize) -> &str {
        &self.nodes[i].name
    }

    /// The index of the node named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Node `i`'s PID while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(Child::id)
    }

    /// A blocking client given every node's URL (it fails over to another node on its own).
    pub fn connect(&self) -> Connection {
        nats_client::connect(&self.url_list())
    }

    /// A blocking client of node `i` alone.
    pub fn connect_node(&self, i: usize) -> Connection {
        nats_client::connect(&self.urls()[i])
    }

    /// Kills node `i` with SIGKILL (no clean shutdown); its store and ports are kept for [`Self::restart`].
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts node `i` again with the same configuration and store, and waits until it accepts connections.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }

    /// Every node's log (failure messages).
    pub fn logs(&self, lines: usize) -> String {
        self.nodes
            .iter()
            .map(|n| {
                let text = std::fs::read_to_string(&n.log).unwrap_or_default();
                let all: Vec<&str> = text.lines().collect();
                format!(
                    "--- nats-server {} ---\n{}",
                    n.name,
                    all[all.len().saturating_sub(lines)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The names of the clients node `i` serves now (`/connz` of its monitoring endpoint; unnamed ones as
    /// `""`); empty while it is down.
    pub fn client_names(&self, i: usize) -> Vec<String> {
        if self.pid(i).is_none() {
            return vec![];
        }
        let body = http_get(self.nodes[i].monitor_port, "/connz?limit=4096")
            .unwrap_or_else(|e| panic!("connz of {}: {e}", self.nodes[i].name));
        let v: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("connz of {}: {e}", self.nodes[i].name));
        v["connections"]
            .as_array()
            .map(|c| {
                c.iter()
                    .map(|c| c["name"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The JetStream consumers node `i` hosts (`consumers` of its monitoring endpoint's `/jsz`); 0 while it is
    /// down.
    pub fn consumers(&self, i: usize) -> u64 {
        if self.pid(i).is_none() {
            return 0;
        }
        let body = http_get(self.nodes[i].monitor_port, "/jsz")
            .unwrap_or_else(|e| panic!("jsz of {}: {e}", self.nodes[i].name));
        let v: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("jsz of {}: {e}", self.nodes[i].name));
        v["consumers"].as_u64().unwrap_or(0)
    }

    /// The indexes of the running nodes that serve a client named `name`.
    pub fn nodes_serving(&self, name: &str) -> Vec<usize> {
        (0..self.size())
            .filter(|i| self.client_names(*i).iter().any(|n| n == name))
            .collect()
    }

    /// A JetStream API request on `conn` (bounded); the answer's JSON, or the API's error as text.
    pub fn api(conn: &Connection, subject: &str, body: &str) -> Result<serde_json::Value, String> {
        let msg = conn
            .request_timeout(subject, body, API_TIMEOUT)
            .map_err(|e| format!("{subject}: {e}"))?;
        let v: serde_json::Value =
            serde_json::from_slice(&msg.data).map_err(|e| format!("{subject}: {e}"))?;
        match v.get("error") {
            Some(err) => Err(format!("{subject}: {err}")),
            None => Ok(v),
        }
    }

    /// Waits until JetStream answers account info through every running node (a meta leader is elected and
    /// known to all); fails the test otherwise.
    pub fn wait_meta_leader(&self, timeout: Duration) {
        let conns: Vec<Connection> = (0..self.size())
            .filter(|i| self.pid(*i).is_some())
            .map(|i| {
                // A node that died after it accepted its first connection (a route port taken, say) says why
                // in its log; show it rather than only "connection refused".
                if TcpStream::connect(("127.0.0.1", self.nodes[i].port)).is_err() {
                    panic!(
                        "nats-server {} stopped accepting connections after start-up\n{}",
                        self.nodes[i].name,
                        self.logs(20)
                    );
                }
                self.connect_node(i)
            })
            .collect();
        let ok = wait_for(timeout, || {
            conns
                .iter()
                .all(|c| Self::api(c, "$JS.API.INFO", "").is_ok())
                .then_some(())
        });
        assert!(
            ok.is_some(),
            "JetStream had no meta leader within {timeout:?}\n{}",
            self.logs(20)
        );
    }

    /// `$JS.API.STREAM.INFO.<stream>` through any running node.
    pub fn stream_info(&self, stream: &str) -> Result<serde_json::Value, String> {
        let conn = self.connect();
        Self::api(&conn, &format!("$JS.API.STREAM.INFO.{stream}"), "")
    }

    /// The server name of `stream`'s leader (the KV bucket `b` is the stream `KV_b`), if it has one now.
    pub fn stream_leader(&self, stream: &str) -> Option<String> {
        let info = self.stream_info(stream).ok()?;
        info["cluster"]["leader"].as_str().map(str::to_string)
    }

    /// Waits until `stream` has a leader and every other node is a current replica (after a restart: caught up);
    /// returns the leader's name. Fails the test otherwise.
    pub fn wait_stream_current(&self, stream: &str, timeout: Duration) -> String {
        let mut last = String::new();
        let got = wait_for(timeout, || {
            let info = match self.stream_info(stream) {
                Ok(i) => i,
                Err(e) => {
                    last = e;
                    return None;
                }
            };
            let cluster = &info["cluster"];
            last = cluster.to_string();
            let leader = cluster["leader"].as_str()?;
            let replicas = cluster["replicas"].as_array()?;
            let all_current = replicas.len() + 1 == self.size()
                && replicas.iter().all(|r| {
                    r["current"].as_bool() == Some(true) && r["offline"].as_bool() != Some(true)
                });
            all_current.then(|| leader.to_string())
        });
        got.unwrap_or_else(|| {
            panic!(
                "stream {stream} has no leader with current replicas within {timeout:?}; last: {last}\n{}",
                self.logs(20)
            )
        })
    }
}

/// `GET <path>` of a monitoring endpoint on 127.0.0.1:`port` (HTTP/1.0, bounded in time and size): the body.
fn http_get(port: u16, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, API_TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(API_TIMEOUT))
        .and_then(|()| s.set_write_timeout(Some(API_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.take(MONITOR_MAX_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP answer to {path}"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!(
            "{path}: {}",
            head.lines().next().unwrap_or_default()
        ));
    }
    Ok(body.to_string())
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}
