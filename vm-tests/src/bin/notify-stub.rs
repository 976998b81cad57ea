//! A stand-in daemon for device-setup tests: `--version` prints the version in its file name
//! (`…-v<version>`), otherwise it sends systemd `READY=1` and sleeps until it is stopped.

use std::os::unix::net::UnixDatagram;

fn version() -> String {
    let exe = std::env::current_exe().unwrap_or_default();
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    name.rsplit_once("-v")
        .map(|(_, v)| v.to_string())
        .unwrap_or_else(|| "0.0.1".into())
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("{}", version());
        return;
    }
    if let Some(path) = std::env::var_os("NOTIFY_SOCKET") {
        if let Ok(sock) = UnixDatagram::unbound() {
            if let Err(e) = sock.send_to(b"READY=1", path) {
                eprintln!("notify-stub: READY=1 not sent: {e}");
            }
        }
    }
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
