//! Fetching candidate artifacts over HTTPS and from OCI registries (being built).
