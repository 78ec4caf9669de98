//! The files a Function ships beside its handler (`spec.files` that are not source), as
//! the builder packs them into the module: one custom section, [`SECTION`], appended to
//! the module it built. They are then covered by the module's digest, which the runtime
//! checks before it reads them, and travel wherever the module does (ConfigMap chunks, an
//! OCI layer, `wasmless dev`'s file). A module without files carries no such section, so
//! it is the module it always was, byte for byte.

/// The custom section's name.
pub const SECTION: &str = "wasmless.files";
/// What the section's payload starts with: a new layout gets a new tag.
const MAGIC: &[u8; 8] = b"wlfiles1";
/// Most a file's name may hold: the builder's rule is stricter still.
const MAX_NAME_BYTES: usize = 255;
/// Most files a module carries, and most bytes they hold together: what a Function's
/// `spec.files` may hold (`wasmless_formats::source`), held again here because a module
/// reaches a runtime from more than the builder (`language: wasm`, a section a Rust handler
/// writes itself), and the files are written to the runtime's disk.
pub const MAX_FILES: usize = 64;
pub const MAX_BYTES: usize = 512 * 1024;

/// One file, by its path relative to the guest's working directory (`templates/a.html`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestFile {
    pub name: String,
    pub bytes: Vec<u8>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GuestFilesError {
    #[error("the module is not WebAssembly (no header)")]
    NotWasm,
    #[error("the module's sections are cut short")]
    Truncated,
    #[error("the module holds {0} {SECTION} sections: a module carries its files once")]
    Several(usize),
    #[error("the {SECTION} section is not one this runtime reads")]
    UnknownLayout,
    #[error("the {SECTION} section names a file {0:?}: {1}")]
    BadName(String, &'static str),
    #[error("the {SECTION} section holds {0} twice")]
    Duplicate(String),
    #[error(
        "the {SECTION} section holds more than {MAX_FILES} files or {MAX_BYTES} bytes: a Function ships at most that"
    )]
    TooMuch,
}

/// Why `name` cannot be a path below the guest's working directory, or `None`: relative,
/// `/`-separated, no empty, `.` or `..` segment, and no segment starting with `.` (which
/// would be hidden, and is where a ConfigMap volume keeps its own `..data`).
pub fn path_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("it is empty");
    }
    if name.len() > MAX_NAME_BYTES {
        return Some("it is too long");
    }
    if name.starts_with('/') {
        return Some("it is an absolute path; name it relative to the handler's folder");
    }
    if name.contains('\\') || name.contains('\0') {
        return Some("it holds a backslash or a NUL; separate folders with /");
    }
    for segment in name.split('/') {
        if segment.is_empty() {
            return Some("it has an empty segment (// or a trailing /)");
        }
        if segment == ".." || segment == "." {
            return Some("it has a . or .. segment; name it from the handler's folder down");
        }
        if segment.starts_with('.') {
            return Some("a segment starts with '.': hidden files are not shipped");
        }
    }
    None
}

/// The module `wasm` with `files` appended as a [`SECTION`] custom section, sorted by
/// name; `wasm` unchanged when there are none.
pub fn append(wasm: &[u8], files: &[GuestFile]) -> Vec<u8> {
    if files.is_empty() {
        return wasm.to_vec();
    }
    let mut sorted: Vec<&GuestFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut payload = Vec::new();
    payload.extend_from_slice(MAGIC);
    payload.extend_from_slice(&(sorted.len() as u32).to_le_bytes());
    for file in sorted {
        payload.extend_from_slice(&(file.name.len() as u32).to_le_bytes());
        payload.extend_from_slice(file.name.as_bytes());
        payload.extend_from_slice(&(file.bytes.len() as u64).to_le_bytes());
        payload.extend_from_slice(&file.bytes);
    }
    with_custom_section(wasm, SECTION, &payload)
}

/// `wasm` with a custom section `name` holding `content` appended (a custom section may
/// come anywhere, and changes nothing a module does).
pub fn with_custom_section(wasm: &[u8], name: &str, content: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    leb128(&mut payload, name.len() as u64);
    payload.extend_from_slice(name.as_bytes());
    payload.extend_from_slice(content);
    let mut out = wasm.to_vec();
    out.push(0);
    leb128(&mut out, payload.len() as u64);
    out.extend_from_slice(&payload);
    out
}

/// The files `wasm` (a module or a component) carries, none when it has no [`SECTION`];
/// every name checked with [`path_problem`]. Read only from bytes whose digest was checked.
pub fn read(wasm: &[u8]) -> Result<Vec<GuestFile>, GuestFilesError> {
    if wasm.len() < 8 || &wasm[..4] != b"\0asm" {
        return Err(GuestFilesError::NotWasm);
    }
    let mut found = Vec::new();
    let mut at = 8;
    while at < wasm.len() {
        let id = wasm[at];
        at += 1;
        let size = read_leb128(wasm, &mut at)? as usize;
        let end = at
            .checked_add(size)
            .filter(|end| *end <= wasm.len())
            .ok_or(GuestFilesError::Truncated)?;
        if id == 0 {
            let mut name_at = at;
            let name_len = read_leb128(&wasm[..end], &mut name_at)? as usize;
            let name_end = name_at
                .checked_add(name_len)
                .filter(|e| *e <= end)
                .ok_or(GuestFilesError::Truncated)?;
            if &wasm[name_at..name_end] == SECTION.as_bytes() {
                found.push(&wasm[name_end..end]);
            }
        }
        at = end;
    }
    match found.as_slice() {
        [] => Ok(Vec::new()),
        [payload] => decode(payload),
        several => Err(GuestFilesError::Several(several.len())),
    }
}

/// Whether `wasm` carries files: a section that does not read counts, so that code compiled
/// from it sends the runtime to the module, which then refuses it with the reason.
pub fn carried(wasm: &[u8]) -> bool {
    read(wasm).map_or(true, |files| !files.is_empty())
}

fn decode(payload: &[u8]) -> Result<Vec<GuestFile>, GuestFilesError> {
    let rest = payload
        .strip_prefix(MAGIC.as_slice())
        .ok_or(GuestFilesError::UnknownLayout)?;
    let mut at: usize = 0;
    let mut take = |n: usize| -> Result<&[u8], GuestFilesError> {
        let end = at
            .checked_add(n)
            .filter(|e| *e <= rest.len())
            .ok_or(GuestFilesError::Truncated)?;
        let bytes = &rest[at..end];
        at = end;
        Ok(bytes)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().unwrap()) as usize;
    if count > MAX_FILES {
        return Err(GuestFilesError::TooMuch);
    }
    let mut files: Vec<GuestFile> = Vec::with_capacity(count);
    let mut total = 0usize;
    for _ in 0..count {
        let name_len = u32::from_le_bytes(take(4)?.try_into().unwrap()) as usize;
        let name = String::from_utf8(take(name_len)?.to_vec())
            .map_err(|_| GuestFilesError::BadName(String::new(), "it is not UTF-8"))?;
        if let Some(problem) = path_problem(&name) {
            return Err(GuestFilesError::BadName(name, problem));
        }
        let size = u64::from_le_bytes(take(8)?.try_into().unwrap());
        let size = usize::try_from(size).map_err(|_| GuestFilesError::TooMuch)?;
        total = total.saturating_add(size);
        if total > MAX_BYTES {
            return Err(GuestFilesError::TooMuch);
        }
        let bytes = take(size)?.to_vec();
        files.push(GuestFile { name, bytes });
    }
    // A repeat, or a file that is also a folder of another (`a` and `a/b`), cannot be written.
    let mut names = std::collections::BTreeSet::new();
    for file in &files {
        if !names.insert(file.name.as_str()) {
            return Err(GuestFilesError::Duplicate(file.name.clone()));
        }
    }
    for file in &files {
        let mut folders = file.name.match_indices('/').map(|(at, _)| &file.name[..at]);
        if let Some(folder) = folders.find(|folder| names.contains(folder)) {
            return Err(GuestFilesError::Duplicate(folder.to_string()));
        }
    }
    Ok(files)
}

fn leb128(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn read_leb128(bytes: &[u8], at: &mut usize) -> Result<u64, GuestFilesError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at).ok_or(GuestFilesError::Truncated)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(GuestFilesError::Truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY_MODULE: &[u8] = b"\0asm\x01\0\0\0";

    fn file(name: &str, text: &str) -> GuestFile {
        GuestFile {
            name: name.into(),
            bytes: text.into(),
        }
    }

    #[test]
    fn a_module_without_files_is_left_as_it_was() {
        assert_eq!(append(EMPTY_MODULE, &[]), EMPTY_MODULE);
        assert_eq!(read(EMPTY_MODULE).unwrap(), Vec::new());
    }

    #[test]
    fn files_come_back_as_they_went_in_sorted_by_name() {
        let files = [
            file("templates/index.html", "<p>hi</p>"),
            file("countries.csv", "fr,France\n"),
        ];
        let packed = append(EMPTY_MODULE, &files);
        let read_back = read(&packed).unwrap();
        assert_eq!(read_back, vec![files[1].clone(), files[0].clone()]);
    }

    #[test]
    fn names_that_would_leave_the_folder_are_refused_even_in_a_module() {
        for name in [
            "../x",
            "/etc/passwd",
            "a//b",
            "a/./b",
            ".git/config",
            "a/../../b",
            "a\\b",
        ] {
            assert!(path_problem(name).is_some(), "{name}");
            let packed = append(EMPTY_MODULE, &[file(name, "x")]);
            assert!(matches!(read(&packed), Err(GuestFilesError::BadName(..))), "{name}");
        }
        let clash = append(EMPTY_MODULE, &[file("a", "x"), file("a.txt", "z"), file("a/b", "y")]);
        assert!(matches!(read(&clash), Err(GuestFilesError::Duplicate(_))));
        let twice = append(EMPTY_MODULE, &[file("a", "x"), file("a", "y")]);
        assert!(matches!(read(&twice), Err(GuestFilesError::Duplicate(_))));
    }

    #[test]
    fn a_module_carrying_more_than_a_function_may_ship_is_refused() {
        let many: Vec<GuestFile> = (0..=MAX_FILES).map(|i| file(&format!("{i}.txt"), "x")).collect();
        assert_eq!(read(&append(EMPTY_MODULE, &many)), Err(GuestFilesError::TooMuch));
        let big = [
            file("a.csv", &"x".repeat(MAX_BYTES / 2 + 1)),
            file("b.csv", &"x".repeat(MAX_BYTES / 2)),
        ];
        assert_eq!(read(&append(EMPTY_MODULE, &big)), Err(GuestFilesError::TooMuch));
        let most: Vec<GuestFile> = (0..MAX_FILES).map(|i| file(&format!("{i}.txt"), "x")).collect();
        assert_eq!(read(&append(EMPTY_MODULE, &most)).unwrap().len(), MAX_FILES);
    }

    #[test]
    fn a_cut_section_is_an_error_not_a_panic() {
        let packed = append(EMPTY_MODULE, &[file("a.csv", "1,2,3")]);
        for end in 9..packed.len() {
            assert!(read(&packed[..end]).is_err(), "{end}");
        }
    }
}
