//! Podman through the libpod REST API on its Unix socket: the HTTP client and the container operations.

pub mod api;
pub mod describe;
pub mod host_paths;
pub mod http;
pub mod limits;
pub mod logs;
pub mod registry_auth;
pub mod secrets;

pub use api::{Observed, Podman, PodmanError};
