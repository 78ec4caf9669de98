//! `runtime_args`: the one place the runtime's flags are written, the operator's half of the
//! contract with `wasmless-runtime`'s `Config`.

use super::*;

/// The runtime's command line for serving `module` as `func` asks: the operator's half of
/// the contract whose other half is `wasmless_runtime::config::Config` (the `cli` crate's
/// tests parse these with it). Their order is part of the pod template, so it stays.
pub fn runtime_args(func: &Function, module: &Module) -> Vec<String> {
    // The code sits where the module does: in the same chunk volume, or as a layer of the
    // same OCI artifact.
    let location = match &module.location {
        ModuleLocation::ConfigMaps { .. } => MODULE_DIR.to_string(),
        ModuleLocation::Oci { reference } => format!("{}{reference}", wasmless_artifact::oci::SCHEME),
    };
    args_with_locations(func, module, location.clone(), location)
}

/// [`runtime_args`] with the module and its code read from the given `--module` and
/// `--code` locations.
pub(in crate::objects) fn args_with_locations(
    func: &Function,
    module: &Module,
    location: String,
    code_location: String,
) -> Vec<String> {
    let mut args = vec![
        "--module".into(),
        location,
        "--module-digest".into(),
        module.digest.to_string(),
    ];
    args.extend(function_args(func));
    if let Some(code) = &module.code {
        args.extend([
            "--code".into(),
            code_location,
            "--code-digest".into(),
            code.digest.to_string(),
        ]);
    }
    args
}

/// The runtime's command line for serving the revisions of a traffic split side by side
/// (`--traffic`), each read from its directory under [`REVISIONS_DIR`] or its OCI artifact.
pub fn split_args(func: &Function, shares: &[Share]) -> Vec<String> {
    let mut args = function_args(func);
    args.extend(["--traffic".into(), routes_json(shares)]);
    args
}

/// Every runtime flag but where the module and its code are: the Function's name, ports,
/// limits and outbound policy. `wasmless dev` serves with these too, its own ports and
/// directories put in place of the pod's.
pub fn function_args(func: &Function) -> Vec<String> {
    let limits = &func.spec.limits;
    let mut args: Vec<String> = [
        ("--function", func.name_any()),
        ("--port", ports::HTTP.to_string()),
        ("--admin-port", ports::ADMIN.to_string()),
        ("--memory-limit", limits.memory.clone()),
        ("--timeout", limits.timeout.clone()),
        ("--max-concurrency", limits.max_concurrency.to_string()),
        ("--max-request-body", limits.max_request_body.clone()),
        ("--cache-dir", CACHE_DIR.into()),
        // The module is pinned by digest and its ConfigMaps are never rewritten (their names
        // carry the source digest): there is nothing to watch for.
        ("--watch-interval", "0".into()),
        ("--drain-delay", format!("{DRAIN_DELAY_SECONDS}s")),
        ("--shutdown-grace", format!("{SHUTDOWN_GRACE_SECONDS}s")),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_string(), value])
    .collect();
    // Only when asked: a flag the runtime defaults anyway would change every Function's
    // pod template, and so restart every pod, when the operator is upgraded.
    if limits.isolation == Isolation::Shared {
        args.extend(["--isolation".into(), "shared".into()]);
    }
    if let Some(outbound) = &func.spec.outbound {
        for pattern in &outbound.allow {
            args.extend(["--outbound-allow".into(), pattern.clone()]);
        }
        args.extend([
            "--outbound-timeout".into(),
            outbound.timeout.clone(),
            "--outbound-max-response-body".into(),
            outbound.max_response_body.clone(),
            "--outbound-max-concurrency".into(),
            outbound.max_concurrency.to_string(),
        ]);
        if outbound.ca_bundle.is_some() {
            args.extend(["--outbound-ca".into(), format!("{OUTBOUND_CA_DIR}/{OUTBOUND_CA_FILE}")]);
        }
        for (index, header) in outbound.headers.iter().enumerate() {
            // The value is in the environment variable the runtime reads; the argument
            // names it, so no Secret value is ever written into the Deployment.
            let mut flag = format!("{} {} {}", header.url, header.name, outbound_header_env(index));
            if header.allow_insecure == Some(true) {
                // The runtime's own opt-in: it sends no header over plain http without it.
                flag.push_str(" allow-insecure");
            }
            args.extend(["--outbound-header".into(), flag]);
        }
    }
    args
}
