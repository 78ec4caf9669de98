//! The store on a directory of its own: what a namespace gets, what survives a restart,
//! what a change at rest does, and what the limits let go of.

use super::*;
use crate::admission::admit;
use wasmless_artifact::{CodeKind, encode_code};

pub(crate) fn code(body: &str) -> (Digest, Admitted) {
    let header = CodeHeader {
        module_digest: Digest::of(body.as_bytes()),
        engine: "ab".repeat(32),
        kind: CodeKind::Module,
        target: "x86-64-v3".into(),
        module_files: false,
    };
    let cwasm = crate::admission::tests::code_starting(format!("\x7fELF{body}").as_bytes());
    let stored = encode_code(&header, &cwasm);
    let digest = Digest::of(&stored);
    (digest, admit(&digest, &stored, 1 << 30).unwrap())
}

fn namespace(name: &str) -> Namespace {
    Namespace::new(name).unwrap()
}

const ROOMY: StoreLimits = StoreLimits {
    budget: 1 << 30,
    namespace_quota: 1 << 30,
};

fn read(found: Found) -> Vec<u8> {
    match found {
        Found::Code(_, file) => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut &file, &mut bytes).unwrap();
            bytes
        }
        other => panic!("expected code, found {other:?}"),
    }
}

#[test]
fn a_namespace_gets_what_it_put_and_another_gets_nothing_until_it_puts_it_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), ROOMY, false).unwrap();
    let (digest, admitted) = code("payments");
    store.put(&namespace("team-a"), &digest, admitted).unwrap();
    assert!(read(store.get(&namespace("team-a"), &digest)).starts_with(b"\x7fELFpayments"));
    assert!(matches!(store.get(&namespace("team-b"), &digest), Found::Absent));
    store.put(&namespace("team-b"), &digest, code("payments").1).unwrap();
    assert!(read(store.get(&namespace("team-b"), &digest)).starts_with(b"\x7fELFpayments"));
    assert_eq!(store.usage().1, 1, "one object for both");
}

#[test]
fn what_was_stored_is_there_after_a_restart_and_a_changed_file_is_corrupt_then_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (digest, admitted) = code("orders");
    Store::open(dir.path(), ROOMY, false)
        .unwrap()
        .put(&namespace("shop"), &digest, admitted)
        .unwrap();
    let store = Store::open(dir.path(), ROOMY, false).unwrap();
    assert!(read(store.get(&namespace("shop"), &digest)).starts_with(b"\x7fELForders"));

    let object = store.object_path(&digest);
    std::fs::set_permissions(&object, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&object).unwrap();
    bytes[5] ^= 1;
    std::fs::write(&object, &bytes).unwrap();
    assert!(matches!(store.get(&namespace("shop"), &digest), Found::Corrupt));
    assert!(!object.exists(), "the changed file was removed");
    assert!(matches!(store.get(&namespace("shop"), &digest), Found::Absent));
}

#[test]
fn a_byte_changed_in_place_is_found_by_the_first_get_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (digest, admitted) = code("billing");
    Store::open(dir.path(), ROOMY, false)
        .unwrap()
        .put(&namespace("shop"), &digest, admitted)
        .unwrap();
    // The identity recorded made to match a file changed in place (as a restore of its
    // ctime would): only the hash finds it.
    let store = Store::open(dir.path(), ROOMY, false).unwrap();
    let object = store.object_path(&digest);
    std::fs::set_permissions(&object, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&object).unwrap();
    bytes[6] ^= 1;
    std::fs::write(&object, &bytes).unwrap();
    let meta_path = store.meta_path(&digest);
    let mut meta = Meta::parse(&std::fs::read_to_string(&meta_path).unwrap()).unwrap();
    meta.identity = Identity::of(&std::fs::metadata(&object).unwrap());
    std::fs::set_permissions(&meta_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(&meta_path, meta.encode()).unwrap();
    assert!(matches!(store.get(&namespace("shop"), &digest), Found::Corrupt));
}

#[test]
fn beyond_a_quota_a_namespace_lets_go_of_its_oldest_and_beyond_the_budget_the_oldest_goes() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two, three, four) = (code("one"), code("two"), code("three"), code("four"));
    // Each is charged 1 MiB, however small: a holds two of its three at most, the node
    // three of the four.
    let limits = StoreLimits {
        budget: 3 << 20,
        namespace_quota: 2 << 20,
    };
    let store = Store::open(dir.path(), limits, false).unwrap();
    let (a, b) = (namespace("a"), namespace("b"));
    store.put(&a, &one.0, one.1).unwrap();
    store.put(&b, &one.0, code("one").1).unwrap();
    store.put(&a, &two.0, two.1).unwrap();
    store.put(&a, &three.0, three.1).unwrap();
    assert!(matches!(store.get(&a, &one.0), Found::Absent), "a's oldest let go");
    assert!(
        read(store.get(&b, &one.0)).starts_with(b"\x7fELFone"),
        "b still holds it"
    );
    assert!(read(store.get(&a, &three.0)).starts_with(b"\x7fELFthree"));
    store.put(&b, &four.0, four.1).unwrap();
    assert_eq!(store.usage().1, 3, "the budget holds three");
    assert!(
        matches!(store.get(&a, &two.0), Found::Absent),
        "the least recently used went"
    );
}

#[test]
fn names_that_are_not_namespaces_are_refused() {
    for name in ["", "../etc", "A", "-a", "a/b", &"a".repeat(64)] {
        assert!(Namespace::new(name).is_err(), "{name:?}");
    }
    assert!(Namespace::new("team-7").is_ok());
}
