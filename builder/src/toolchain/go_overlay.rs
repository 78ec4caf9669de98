//! The `-overlay` of every Go handler build: files added to, or put in place of, files of
//! Go's standard library, made from the GOROOT of the Go that builds (an overlay names
//! files by their absolute path). Only the standard library and serde_json are used:
//! runtime/tests/support builds its Go test handlers with this same file (`#[path]`).
//!
//! - runtime: a file added (sdk/go/reactor/reseed_runtime.go.in) that lets the SDK reseed
//!   Go's random generator per request.
//! - net/http: roundtrip.go replaced (sdk/go/outbound/roundtrip.go.in), so every
//!   Transport sends through the host.
//! - net: a file added (sdk/go/outbound/net.go.in), and one line inserted at the top of
//!   each way to a socket, so net.Dial, net.Listen and the like fail with an error that
//!   says raw sockets are not available and what to use instead. The lines are inserted
//!   into a copy of this Go's own file, after a line found by its text; a line not found
//!   (another Go version) leaves that file as Go has it, so a build never fails for it
//!   (the builder's tests check that every line is found in the Go they build with).
//! - syscall: the error strings of wasip1 (`tables_wasip1.go`) lower-cased, as Go on Linux
//!   has them: an error a handler shows reads as under native Go (`open countries.csv: no
//!   such file or directory`, not `No such file or directory`).

use std::path::{Path, PathBuf};

const RUNTIME_RESEED: &str = include_str!("../../../sdk/go/reactor/reseed_runtime.go.in");
const NET_HTTP_ROUNDTRIP: &str = include_str!("../../../sdk/go/outbound/roundtrip.go.in");
const NET_NO_SOCKETS: &str = include_str!("../../../sdk/go/outbound/net.go.in");

/// A line inserted into a file of package net: the file, how the line it goes after
/// starts (that line ends with `{`, the function's body opening), and the line.
pub struct NetPatch {
    pub file: &'static str,
    pub after: &'static str,
    pub insert: &'static str,
}

pub const NET_PATCHES: [NetPatch; 4] = [
    // net.Dial, net.DialTimeout, (*Dialer).Dial and DialContext, and the resolver's own
    // dials (a name is looked up before a socket is asked for).
    NetPatch {
        file: "dial.go",
        after: "func (d *Dialer) DialContext(ctx context.Context, network, address string) (Conn, error) {",
        insert: "\tif err := wasmlessNoSockets(\"dial\", network, address); err != nil {\n\t\treturn nil, err\n\t}",
    },
    // net.Listen.
    NetPatch {
        file: "dial.go",
        after: "func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (Listener, error) {",
        insert: "\tif err := wasmlessNoSockets(\"listen\", network, address); err != nil {\n\t\treturn nil, err\n\t}",
    },
    // net.ListenPacket.
    NetPatch {
        file: "dial.go",
        after: "func (lc *ListenConfig) ListenPacket(ctx context.Context, network, address string) (PacketConn, error) {",
        insert: "\tif err := wasmlessNoSockets(\"listen\", network, address); err != nil {\n\t\treturn nil, err\n\t}",
    },
    // Every other way (DialTCP, ListenUDP, ...): the fake network's one socket function,
    // whatever its parameters are called.
    NetPatch {
        file: "net_fake.go",
        after: "func socket(",
        insert: "\tif err := wasmlessNoSockets(\"socket\", \"\", \"\"); err != nil {\n\t\treturn nil, err\n\t}",
    },
];

/// `text` with each of `patches` for `file` inserted, and how many were.
pub fn patch(text: &str, file: &str, patches: &[NetPatch]) -> (String, usize) {
    let mut out = String::with_capacity(text.len() + 512);
    let mut applied = 0;
    for line in text.split_inclusive('\n') {
        out.push_str(line);
        let trimmed = line.trim_end();
        if let Some(found) = patches
            .iter()
            .find(|p| p.file == file && trimmed.starts_with(p.after) && trimmed.ends_with('{'))
        {
            out.push_str(found.insert);
            out.push('\n');
            applied += 1;
        }
    }
    (out, applied)
}

/// `tables_wasip1.go` with the first letter of each of `errorstr`'s strings lower-cased,
/// and how many were.
pub fn lower_case_errors(text: &str) -> (String, usize) {
    let mut out = String::with_capacity(text.len());
    let (mut inside, mut changed) = (false, 0);
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed.starts_with("var errorstr = [...]string{") {
            inside = true;
        } else if inside && trimmed == "}" {
            inside = false;
        } else if inside
            && let Some((name, text)) = line.split_once(": ")
            && let Some(quoted) = text.trim_start().strip_prefix('"')
            && let Some(first) = quoted.chars().next().filter(char::is_ascii_uppercase)
        {
            let spaces = &text[..text.len() - text.trim_start().len()];
            out.push_str(&format!(
                "{name}: {spaces}\"{}{}",
                first.to_ascii_lowercase(),
                &quoted[1..]
            ));
            changed += 1;
            continue;
        }
        out.push_str(line);
    }
    (out, changed)
}

/// Writes the overlay's files and `overlay.json` into `dir` (not as `.go` files: in a
/// package's directory they would be part of it), for the Go whose GOROOT is `goroot`;
/// returns the path of `overlay.json`.
pub fn write(goroot: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    let src = goroot.join("src");
    let mut replace = serde_json::Map::new();
    let mut add = |target: PathBuf, name: &str, text: &str| -> std::io::Result<()> {
        let file = dir.join(name);
        std::fs::write(&file, text)?;
        replace.insert(
            target.to_string_lossy().into_owned(),
            serde_json::Value::String(file.to_string_lossy().into_owned()),
        );
        Ok(())
    };
    add(
        src.join("runtime/wasmless_reseed.go"),
        "wasmless_reseed.go.in",
        RUNTIME_RESEED,
    )?;
    add(
        src.join("net/http/roundtrip.go"),
        "wasmless_roundtrip.go.in",
        NET_HTTP_ROUNDTRIP,
    )?;
    add(
        src.join("net/wasmless_nosockets.go"),
        "wasmless_nosockets.go.in",
        NET_NO_SOCKETS,
    )?;
    for file in ["dial.go", "net_fake.go"] {
        let Ok(text) = std::fs::read_to_string(src.join("net").join(file)) else {
            continue;
        };
        let (patched, applied) = patch(&text, file, &NET_PATCHES);
        if applied > 0 {
            add(src.join("net").join(file), &format!("wasmless_net_{file}.in"), &patched)?;
        }
    }
    if let Ok(text) = std::fs::read_to_string(src.join("syscall/tables_wasip1.go")) {
        let (lowered, changed) = lower_case_errors(&text);
        if changed > 0 {
            add(
                src.join("syscall/tables_wasip1.go"),
                "wasmless_tables_wasip1.go.in",
                &lowered,
            )?;
        }
    }
    let overlay = dir.join("overlay.json");
    let json = serde_json::json!({ "Replace": replace });
    std::fs::write(&overlay, json.to_string())?;
    Ok(overlay)
}
