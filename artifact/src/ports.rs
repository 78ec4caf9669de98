//! The runtime's two ports, one truth for the runtime's defaults, the CLI's `dev` and the
//! operator's pod template and Service.

/// The function's HTTP port (`--port`, `WASMLESS_PORT`): the container port `http`.
pub const HTTP: u16 = 8080;

/// The admin port (`--admin-port`, `WASMLESS_ADMIN_PORT`): `/metrics`, `/healthz` and
/// `/readyz`, the container port `metrics`. A Function's Service carries it beside its
/// own port, so `spec.serverPort` may not take this number.
pub const ADMIN: u16 = 9090;
