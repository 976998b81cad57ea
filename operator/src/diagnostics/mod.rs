//! Diagnostics of a device on request (docs/diagnostics.md): a `DeviceDiagnostics` object
//! ([`crate::crd::diagnostics`]) becomes a request in `diagnostics-request/<device>.<uid>`; the device's bundle in
//! `diagnostics-bundle` is copied into the object's status, and the request key deleted (fleet-auth then refuses
//! any further bundle for it) and the bundle key too. One concern per file: [`request`] (spec → request),
//! [`admission`] (the webhook's check), [`queue`] (which requests may be written now: one open per device, at most
//! `max_open_requests` across the fleet), [`phase`] (the pure phase decision), [`bundles`] (the bundle watch),
//! [`sweep`] (request and bundle keys of gone objects), [`controller`] (the loop).

pub mod admission;
pub mod bundles;
pub mod controller;
pub mod phase;
pub mod queue;
pub mod request;
pub mod sweep;
